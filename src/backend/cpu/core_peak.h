#pragma once

namespace llmtrain {

// The dense fp32 peak of one core of the machine running this, measured rather than assumed:
// the FLOP rate of fused multiply-adds (2 FLOPs per lane) in the widest vectors the core
// runs, on enough independent chains that no FMA waits for the one before it
// (chains >= FMA latency x FMA units: 4 x 2 on current x86 cores; 12 are used). The best of
// several short runs, so a busy machine lowers it as little as possible. Measured once per
// process (~0.1 s) and cached. A CPU cluster file's `peak_tflops = "auto"` reads it, so that
// the efficiencies `bench` calibrates are shares of this machine's peak, whatever its
// vector width.
double measured_core_fp32_peak_tflops();

}  // namespace llmtrain
