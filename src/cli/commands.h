// Subcommands: each file under src/cli/ registers one on the CLI11 app. A registered
// command stores its callback; main() runs it and turns a thrown Error into one line on
// stderr and a non-zero exit.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace llmtrain {

using CommandAction = std::function<int()>;

// Ends the process with this exit code; whatever was to be said is said already (by this
// rank or by another): main() prints nothing more.
struct ExitNow {
    int code;
};

// `llmtrain train CONFIG [--set key=value ...] [--run-dir DIR] [--dry-run]`
void register_train_command(CLI::App& app, CommandAction& action);
// `llmtrain tokenizer train|encode|decode ...`
void register_tokenizer_command(CLI::App& app, CommandAction& action);
// `llmtrain prepare --tokenizer T --input FILES --output DIR ...`
void register_prepare_command(CLI::App& app, CommandAction& action);
// `llmtrain bench comm [--backend mpi|nccl] [--op ...] [--min-bytes N] [--max-bytes N]`
void register_bench_command(CLI::App& app, CommandAction& action);
// `llmtrain plan CONFIG --cluster CLUSTER.toml [--search] [--gpus N] [--json]`
void register_plan_command(CLI::App& app, CommandAction& action);
// `llmtrain checkpoint list|verify|inspect|export PATH ...`
void register_checkpoint_command(CLI::App& app, CommandAction& action);
// `llmtrain generate CKPT_OR_RUN_DIR [--prompt TEXT] [--max-tokens N] [--temperature T] ...`
void register_generate_command(CLI::App& app, CommandAction& action);
// `llmtrain eval CKPT_OR_RUN_DIR [--data PATH] [--json]`
void register_eval_command(CLI::App& app, CommandAction& action);
// `llmtrain data verify DATASET... [--threads N] [--json]`
void register_data_command(CLI::App& app, CommandAction& action);
// `llmtrain doctor [CONFIG] [--data] [--checkpoint-dir DIR] [--json]`
void register_doctor_command(CLI::App& app, CommandAction& action);
// `llmtrain bench CONFIG [--warmup N] [--steps M] [--set ...]`, on the `bench` app.
void register_bench_train(CLI::App& bench, CommandAction& action);
// `llmtrain bench tokenizer --tokenizer T --input FILES [--repeat N] [--split-engine fastest|pcre2]`
void register_bench_tokenizer(CLI::App& bench, CommandAction& action);
// `llmtrain bench attention [--shape B,T,H,Hkv,D ...] [--dtype both|bf16|fp16] [--iters N]`, on the `bench` app.
void register_bench_attention(CLI::App& bench, CommandAction& action);
// `llmtrain bench gemm [--shape M,N,K ...] [--device cuda|cpu] [--iters N]`, on the `bench` app.
void register_bench_gemm(CLI::App& bench, CommandAction& action);
// `llmtrain bench moe [--device cuda|cpu] [--tokens N --d-model C --experts E --top-k k --d-ff-expert F]
// [--capacity-factor c] [--balanced]`, on the `bench` app.
void register_bench_moe(CLI::App& bench, CommandAction& action);

}  // namespace llmtrain
