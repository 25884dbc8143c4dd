// llmtrain: pre-trains decoder-only transformers. main() parses the command line, runs
// the chosen subcommand and turns any error into one line on stderr and a non-zero exit.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "cli/version.h"
#include "core/error.h"

int main(int argc, char** argv) {
    CLI::App app("llmtrain: pre-train GPT-2 and Llama-style language models", "llmtrain");
    app.set_version_flag("--version", llmtrain::version_text);
    app.require_subcommand(1);
    llmtrain::CommandAction action;
    llmtrain::register_train_command(app, action);
    llmtrain::register_tokenizer_command(app, action);
    llmtrain::register_prepare_command(app, action);
    llmtrain::register_bench_command(app, action);
    try {
        app.parse(argc, argv);
        return action ? action() : 0;
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    } catch (const llmtrain::Error& e) {
        std::fprintf(stderr, "llmtrain: %s: %s\n", llmtrain::error_kind_name(e.kind()), e.what());
        // 2: the input (config, data) is wrong; 1: something failed while running.
        const bool bad_input = e.kind() == llmtrain::ErrorKind::config || e.kind() == llmtrain::ErrorKind::data;
        return bad_input ? 2 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "llmtrain: error: %s\n", e.what());
        return 1;
    }
}
