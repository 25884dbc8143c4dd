#include "core/signals.h"

#include <csignal>
#include <initializer_list>
#include <cstring>
#include <ctime>
#include <unistd.h>

namespace llmtrain {

namespace {
// Signal handlers can reach nothing but globals; these two are the process's signal state.
volatile std::sig_atomic_t g_stop_signal = 0;
int g_crash_log_fd = -1;

void on_stop_signal(int signal) {
    if (g_stop_signal == SIGINT && signal == SIGINT) {
        // The second Ctrl-C: stop now.
        std::signal(SIGINT, SIG_DFL);
        std::raise(SIGINT);
        return;
    }
    if (g_stop_signal == 0) {
        g_stop_signal = signal;
        static const char note[] = "llmtrain: stop requested; finishing the current step\n";
        static const char note_sigint[] = "llmtrain: stop requested; finishing the current step (Ctrl-C again to stop at once)\n";
        const bool sigint = signal == SIGINT;
        [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, sigint ? note_sigint : note, sigint ? sizeof note_sigint - 1 : sizeof note - 1);
    }
}

// Appends decimal digits of value to out (no allocation, no locale: async-signal-safe).
char* append_number(char* out, long long value) {
    char digits[24];
    int n = 0;
    if (value < 0) { *out++ = '-'; value = -value; }
    do { digits[n++] = static_cast<char>('0' + value % 10); value /= 10; } while (value > 0);
    while (n > 0) *out++ = digits[--n];
    return out;
}

char* append_text(char* out, const char* text) {
    const size_t n = std::strlen(text);
    std::memcpy(out, text, n);
    return out + n;
}

void on_fatal_signal(int signal) {
    if (g_crash_log_fd >= 0) {
        char line[256];
        char* p = append_text(line, "{\"event\":\"crash\",\"signal\":\"");
        p = append_text(p, signal_name(signal));
        p = append_text(p, "\",\"exit_code\":");
        p = append_number(p, 128 + signal);
        p = append_text(p, ",\"unix_time\":");
        timespec now{};
        clock_gettime(CLOCK_REALTIME, &now);
        p = append_number(p, now.tv_sec);
        p = append_text(p, "}\n");
        [[maybe_unused]] const ssize_t n = ::write(g_crash_log_fd, line, static_cast<size_t>(p - line));
    }
    std::signal(signal, SIG_DFL);
    std::raise(signal);
}

void handle(int signal, void (*handler)(int)) {
    struct sigaction action {};
    action.sa_handler = handler;
    sigemptyset(&action.sa_mask);
    sigaction(signal, &action, nullptr);
}
}  // namespace

void install_stop_signal_handlers() {
    for (int signal : {SIGINT, SIGTERM, SIGUSR1}) handle(signal, on_stop_signal);
}

int pending_stop_signal() { return g_stop_signal; }

void install_crash_record(int log_fd) {
    g_crash_log_fd = log_fd;
    for (int signal : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) handle(signal, on_fatal_signal);
}

const char* signal_name(int signal) {
    switch (signal) {
        case SIGINT: return "SIGINT";
        case SIGTERM: return "SIGTERM";
        case SIGUSR1: return "SIGUSR1";
        case SIGSEGV: return "SIGSEGV";
        case SIGBUS: return "SIGBUS";
        case SIGFPE: return "SIGFPE";
        case SIGILL: return "SIGILL";
        case SIGABRT: return "SIGABRT";
        case SIGKILL: return "SIGKILL";
        default: return "signal";
    }
}

}  // namespace llmtrain
