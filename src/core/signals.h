// Process signals of a training run.
//
// Stop signals (SIGINT, SIGTERM, SIGUSR1) do not kill: the handler only notes the first one,
// and the step loop ends the run at the next step boundary, with a record of why (Slurm sends
// SIGTERM, or SIGUSR1 with --signal, before a time limit or a preemption). A second SIGINT
// ends the process at once, as Ctrl-C twice does elsewhere.
//
// Fatal signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) append one "crash" record to the
// run's log file, then take their default action (core dump, exit status 128 + signal), so a
// crashed run is told apart from a killed one (SIGKILL leaves no record at all).
#pragma once

namespace llmtrain {

void install_stop_signal_handlers();
// The first stop signal received since install_stop_signal_handlers(), or 0.
int pending_stop_signal();

// From now on a fatal signal appends {"event":"crash",...} to the file open at fd (O_APPEND).
void install_crash_record(int log_fd);

// "SIGTERM" for SIGTERM; "signal" for one not named here.
const char* signal_name(int signal);

}  // namespace llmtrain
