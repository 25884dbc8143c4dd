// llmtrain: pre-trains decoder-only transformers. main() parses the command line, runs the
// chosen subcommand and turns any error into one line on stderr, "llmtrain: <kind>: <what>",
// and the exit code of README's table (core/exit_code.h).
#ifdef LLMTRAIN_FUZZ_SKIP_CHECKSUMS
#error "llmtrain verifies every checksum it reads: LLMTRAIN_FUZZ_SKIP_CHECKSUMS belongs to the fuzz targets alone (core/checksum_policy.h)"
#endif
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "cli/commands.h"
#include "cli/version.h"
#include "core/error.h"
#include "core/exit_code.h"
#include "core/log.h"

namespace {

// CLI11 would say "The following argument was not expected: foo" for a misspelt command.
bool is_unknown_subcommand(const CLI::App& app, int argc, char** argv) {
    if (argc < 2 || argv[1][0] == '-') return false;
    for (const CLI::App* command : app.get_subcommands({})) if (command->get_name() == argv[1]) return false;
    return true;
}

std::string subcommand_names(const CLI::App& app) {
    std::string names;
    for (const CLI::App* command : app.get_subcommands({})) names += (names.empty() ? "" : ", ") + command->get_name();
    return names;
}

}  // namespace

int main(int argc, char** argv) {
    using namespace llmtrain;
    CLI::App app("llmtrain: pre-train GPT-2 and Llama-style language models", "llmtrain");
    app.set_version_flag("--version", llmtrain::version_text);
    app.require_subcommand(1);
    CommandAction action;
    register_train_command(app, action);
    register_tokenizer_command(app, action);
    register_prepare_command(app, action);
    register_data_command(app, action);
    register_bench_command(app, action);
    register_checkpoint_command(app, action);
    register_plan_command(app, action);
    register_generate_command(app, action);
    register_eval_command(app, action);
    register_doctor_command(app, action);
    try {
        if (is_unknown_subcommand(app, argc, argv)) {
            print_error_line(cat("llmtrain: usage error: unknown subcommand '", argv[1], "' (one of: ", subcommand_names(app), "; see llmtrain --help)"));
            return exit_bad_input;
        }
        app.parse(argc, argv);
        return action ? action() : exit_ok;
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
        print_error_line(cat("llmtrain: usage error: ", e.what(), " (see --help)"));
        return exit_bad_input;
    } catch (const ExitNow& e) {
        return e.code;
    } catch (const Error& e) {
        print_error_line(cat("llmtrain: ", error_kind_name(e.kind()), ": ", e.what()));
        return exit_code_for(e.kind());
    } catch (const std::bad_alloc&) {
        print_error_line("llmtrain: error: out of memory (std::bad_alloc); `llmtrain train CONFIG --dry-run` prints the memory plan");
        return exit_failure;
    } catch (const std::exception& e) {
        print_error_line(cat("llmtrain: error: ", e.what()));
        return exit_failure;
    }
}
