// Arbitrary bytes as a JSONL input of `llmtrain prepare` (input.jsonl: each line an object
// whose "text" is a document), read as prepare reads it (prepare_input.h): planned into work
// units, read, checked to be text, its records split into documents with --on-bad-record abort
// and skip. Never a crash; every refusal names the file (and the line, for a record); the
// documents do not depend on the units.
#include <cstddef>
#include <cstdint>

#include "fuzz_input.h"
#include "prepare_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    llmtrain::fuzz::check_prepare_reads(llmtrain::fuzz::write_scratch_file("input.jsonl", data, size));
    return 0;
}
