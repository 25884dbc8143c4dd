#include "data/prepare_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace llmtrain {

namespace {

uint64_t count_newlines(std::string_view text) { return static_cast<uint64_t>(std::count(text.begin(), text.end(), '\n')); }

std::string pread_range(const std::string& path, uint64_t begin, uint64_t end) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(ErrorKind::data, "cannot open input '", path, "': ", std::strerror(errno));
    std::string bytes(static_cast<size_t>(end - begin), '\0');
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(begin + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            ::close(fd);
            fail(ErrorKind::io, "input '", path, "' changed while being read (short read at byte ", begin + done, ")");
        }
        done += static_cast<size_t>(n);
    }
    ::close(fd);
    return bytes;
}

}  // namespace

// One job's stream: the file it is in, the reader positioned at `offset` of its text, and
// the turn (unit index) whose read is next.
struct UnitReader::JobStream {
    std::mutex mutex;
    std::condition_variable turn_changed;
    size_t next_unit = 0;
    bool broken = false;
    size_t file = SIZE_MAX;
    std::unique_ptr<TextReader> reader;
    uint64_t offset = 0, newlines = 0;
};

UnitReader::UnitReader(const PreparePlan& plan) : plan_(plan), line_anchors_(plan.files.size()) {
    for (size_t u = 0; u < plan.units.size(); ++u) {
        if (plan.units[u].job < jobs_.size()) continue;
        jobs_.push_back(std::make_unique<JobStream>());
        jobs_.back()->next_unit = u;  // units of a job are consecutive
    }
}

UnitReader::~UnitReader() = default;

std::vector<SegmentText> UnitReader::read(size_t u) {
    const Unit& unit = plan_.units[u];
    JobStream& job = *jobs_[unit.job];
    std::unique_lock<std::mutex> lock(job.mutex);
    job.turn_changed.wait(lock, [&] { return job.next_unit == u; });
    const auto pass_turn = [&] {
        job.next_unit = u + 1;
        job.turn_changed.notify_all();
    };
    if (job.broken) {
        pass_turn();
        fail(ErrorKind::data, "prepare: unit ", u, " cannot be read: an earlier unit of its compressed input failed");
    }
    std::vector<SegmentText> texts;
    try {
        for (const Segment& s : unit.segments) {
            const InputFile& file = plan_.files[s.file];
            if (file.format == InputFormat::parquet) texts.push_back(SegmentText{s, "", [] { return uint64_t{0}; }});  // read by row group (parquet_input.h)
            else texts.push_back(file.compression == Compression::none ? read_plain(s) : read_compressed(job, s));
        }
    } catch (...) {
        job.broken = true;
        pass_turn();
        throw;
    }
    pass_turn();
    return texts;
}

SegmentText UnitReader::read_plain(const Segment& s) {
    SegmentText t{s, pread_range(plan_.files[s.file].path, s.begin, s.end), nullptr};
    t.first_line = [this, s] { return plain_lines_before(s.file, s.begin) + 1; };
    return t;
}

SegmentText UnitReader::read_compressed(JobStream& job, const Segment& s) {
    const InputFile& file = plan_.files[s.file];
    if (job.file != s.file || job.offset > s.begin) {
        job.reader = std::make_unique<TextReader>(file.path);
        job.file = s.file;
        job.offset = job.newlines = 0;
    }
    std::string text;
    while (job.offset < s.begin) {  // only when a job starts inside a file, which the plan avoids
        text.clear();
        job.reader->read_into(text, static_cast<size_t>(std::min<uint64_t>(s.begin - job.offset, 1 << 20)));
        if (text.empty()) break;
        job.offset += text.size();
        job.newlines += count_newlines(text);
    }
    text.clear();
    job.reader->read_into(text, static_cast<size_t>(s.end - s.begin));
    if (job.offset != s.begin || text.size() != s.end - s.begin)
        fail(ErrorKind::io, "input '", file.path, "' changed while being read: its text ends at byte ", job.offset + text.size(), ", the plan expected ", s.end);
    const uint64_t first_line = job.newlines + 1;
    job.offset = s.end;
    job.newlines += count_newlines(text);
    return SegmentText{s, std::move(text), [first_line] { return first_line; }};
}

// Newlines before `offset`, counted from the nearest offset counted before (anchors grow as
// a rank's units advance through the file, so a file is read about once).
uint64_t UnitReader::plain_lines_before(size_t file, uint64_t offset) {
    std::lock_guard<std::mutex> lock(lines_mutex_);
    auto& anchors = line_anchors_[file];
    anchors.emplace(0, 0);
    auto it = std::prev(anchors.upper_bound(offset));
    uint64_t position = it->first, newlines = it->second;
    constexpr uint64_t kChunk = 4 << 20;
    while (position < offset) {
        const uint64_t end = std::min(offset, position + kChunk);
        newlines += count_newlines(pread_range(plan_.files[file].path, position, end));
        position = end;
    }
    anchors[offset] = newlines;
    return newlines;
}

}  // namespace llmtrain
