// The progress board of an MPI job: each node's records in a POSIX shared-memory segment,
// and the exchange that reads other nodes' records by asking their ranks.
//
// Asking: the diagnosing rank sends each node it needs a question (the world ranks wanted)
// to every rank of that node, since any of them can read the node's segment and some may be
// stopped or busy; the first answer per node is taken. A rank answers whenever its host
// waits in a collective (MpiComm's bounded wait) or itself diagnoses a hang: after a hang,
// the ranks still running soon wait on it, and answer then. Messages are small (a record is
// about 2 KB) and only flow at a timeout; nothing is sent while training goes well.
#include <fcntl.h>
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <type_traits>

#include "core/error.h"
#include "parallel/launch_env.h"
#include "parallel/progress_board.h"

namespace llmtrain {

namespace {

static_assert(std::is_trivially_copyable_v<RankProgress>, "records travel between nodes as bytes");

constexpr int kQuestionTag = 1, kAnswerTag = 2;
constexpr size_t kHostBytes = 64;

// A question: its id, then the world ranks wanted. An answer: the question's id, then records.
class MpiProgressExchange final : public ProgressExchange {
public:
    MpiProgressExchange(const ProgressBoard& board, std::vector<int> node_of_rank) : board_(board), node_of_rank_(std::move(node_of_rank)) {
        MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
        MPI_Comm_rank(comm_, &rank_);
    }
    ~MpiProgressExchange() override {
        for (Pending& p : pending_) {
            MPI_Cancel(&p.request);
            MPI_Request_free(&p.request);
        }
        MPI_Comm_free(&comm_);
    }

    std::vector<RankProgress> ask(const std::vector<int>& world_ranks, std::chrono::steady_clock::time_point deadline) override {
        const int id = ++questions_;
        std::set<int> nodes;
        for (int rank : world_ranks) nodes.insert(node_of_rank_.at(static_cast<size_t>(rank)));
        std::vector<char> question(sizeof(int) * (world_ranks.size() + 1));
        std::memcpy(question.data(), &id, sizeof id);
        std::memcpy(question.data() + sizeof id, world_ranks.data(), sizeof(int) * world_ranks.size());
        for (size_t r = 0; r < node_of_rank_.size(); ++r)
            if (nodes.count(node_of_rank_[r]) && static_cast<int>(r) != rank_) send(question, static_cast<int>(r), kQuestionTag);
        std::vector<RankProgress> records;
        std::set<int> answered;
        while (answered.size() < nodes.size() && std::chrono::steady_clock::now() < deadline) {
            answer();  // two ranks diagnosing at once ask each other
            if (!take_answer(id, answered, records)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return records;
    }

    void answer() override {
        retire_sends();
        for (;;) {
            int arrived = 0;
            MPI_Status status;
            MPI_Iprobe(MPI_ANY_SOURCE, kQuestionTag, comm_, &arrived, &status);
            if (!arrived) return;
            int bytes = 0;
            MPI_Get_count(&status, MPI_BYTE, &bytes);
            std::vector<char> question(static_cast<size_t>(bytes));
            MPI_Recv(question.data(), bytes, MPI_BYTE, status.MPI_SOURCE, kQuestionTag, comm_, MPI_STATUS_IGNORE);
            if (question.size() < sizeof(int)) continue;
            std::vector<int> wanted((question.size() - sizeof(int)) / sizeof(int));
            std::memcpy(wanted.data(), question.data() + sizeof(int), sizeof(int) * wanted.size());
            const std::vector<RankProgress> records = read_on_this_node(board_, wanted);
            std::vector<char> reply(sizeof(int) + sizeof(RankProgress) * records.size());
            std::memcpy(reply.data(), question.data(), sizeof(int));  // the question's id
            std::memcpy(reply.data() + sizeof(int), records.data(), sizeof(RankProgress) * records.size());
            send(reply, status.MPI_SOURCE, kAnswerTag);
        }
    }

private:
    struct Pending {
        MPI_Request request;
        std::vector<char> bytes;  // kept until the send completes
    };

    void send(std::vector<char> bytes, int to, int tag) {
        pending_.push_back({MPI_REQUEST_NULL, std::move(bytes)});
        Pending& p = pending_.back();
        MPI_Isend(p.bytes.data(), static_cast<int>(p.bytes.size()), MPI_BYTE, to, tag, comm_, &p.request);
    }
    void retire_sends() {
        std::erase_if(pending_, [](Pending& p) {
            int done = 0;
            MPI_Test(&p.request, &done, MPI_STATUS_IGNORE);
            return done != 0;
        });
    }
    // One answer, if one has arrived; an answer to an earlier question is dropped.
    bool take_answer(int id, std::set<int>& answered, std::vector<RankProgress>& records) {
        int arrived = 0;
        MPI_Status status;
        MPI_Iprobe(MPI_ANY_SOURCE, kAnswerTag, comm_, &arrived, &status);
        if (!arrived) return false;
        int bytes = 0;
        MPI_Get_count(&status, MPI_BYTE, &bytes);
        std::vector<char> reply(static_cast<size_t>(bytes));
        MPI_Recv(reply.data(), bytes, MPI_BYTE, status.MPI_SOURCE, kAnswerTag, comm_, MPI_STATUS_IGNORE);
        int answer_id = 0;
        if (reply.size() < sizeof(int)) return true;
        std::memcpy(&answer_id, reply.data(), sizeof answer_id);
        const int node = node_of_rank_.at(static_cast<size_t>(status.MPI_SOURCE));
        if (answer_id != id || answered.count(node)) return true;
        answered.insert(node);
        const size_t count = (reply.size() - sizeof(int)) / sizeof(RankProgress);
        for (size_t i = 0; i < count; ++i) {
            RankProgress p;
            std::memcpy(&p, reply.data() + sizeof(int) + i * sizeof(RankProgress), sizeof p);
            records.push_back(p);
        }
        return true;
    }

    const ProgressBoard& board_;
    std::vector<int> node_of_rank_;
    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0;
    int questions_ = 0;
    std::vector<Pending> pending_;
};

// A name no other job or node uses: world rank 0's pid and a random number, broadcast, and
// the node's first world rank.
std::string segment_name(int leader) {
    uint64_t token[2] = {static_cast<uint64_t>(getpid()), std::random_device{}()};
    MPI_Bcast(token, 2, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    return cat("/llmtrain-progress-", token[0], "-", token[1], "-", leader);
}

// This node's segment of `ranks` records, mapped; the node's first rank creates it, and
// unlinks it once every rank of the node has it mapped. Throws on every rank of the node
// when any of them could not map it.
std::shared_ptr<void> map_node_segment(MPI_Comm node, int local_rank, int ranks, const std::string& name) {
    const size_t bytes = sizeof(SharedRank) * static_cast<size_t>(ranks);
    std::string problem;
    const auto attempt = [&](int flags) {
        const int fd = shm_open(name.c_str(), flags, 0600);
        if (fd < 0) return problem = cat("shm_open: ", std::strerror(errno)), static_cast<void*>(MAP_FAILED);
        void* at = MAP_FAILED;
        if ((flags & O_CREAT) && ftruncate(fd, static_cast<off_t>(bytes)) != 0) problem = cat("ftruncate: ", std::strerror(errno));
        else if ((at = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) problem = cat("mmap: ", std::strerror(errno));
        close(fd);
        return at;
    };
    void* at = MAP_FAILED;
    if (local_rank == 0) at = attempt(O_CREAT | O_EXCL | O_RDWR);
    MPI_Barrier(node);
    if (local_rank != 0) at = attempt(O_RDWR);
    int mapped = at != MAP_FAILED, everywhere = 0;
    MPI_Allreduce(&mapped, &everywhere, 1, MPI_INT, MPI_MIN, node);
    if (local_rank == 0) shm_unlink(name.c_str());
    if (!everywhere) {
        if (at != MAP_FAILED) munmap(at, bytes);
        fail(ErrorKind::runtime, "cannot share the communication progress records of this node's ranks (POSIX shared memory ", name, ", ", bytes, " bytes)",
             problem.empty() ? ": another rank of the node failed" : cat(": ", problem));
    }
    return std::shared_ptr<void>(at, [bytes](void* p) { munmap(p, bytes); });
}

}  // namespace

std::shared_ptr<ProgressBoard> make_mpi_progress_board(GroupRanks group_ranks, NodeScope scope) {
    int world_rank = 0, world_size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    MPI_Comm node = MPI_COMM_NULL;
    if (scope == NodeScope::each_rank) MPI_Comm_split(MPI_COMM_WORLD, world_rank, 0, &node);
    else MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
    int local_rank = 0, local_size = 1;
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);

    // Each rank's node (named by the node's first world rank), index on it and host name.
    int leader = world_rank;
    MPI_Bcast(&leader, 1, MPI_INT, 0, node);
    const int mine[2] = {leader, local_rank};
    std::vector<int> places(2 * static_cast<size_t>(world_size));
    MPI_Allgather(mine, 2, MPI_INT, places.data(), 2, MPI_INT, MPI_COMM_WORLD);
    std::vector<char> hosts(kHostBytes * static_cast<size_t>(world_size));
    std::vector<char> host(kHostBytes, 0);
    const std::string name = this_node_name().substr(0, kHostBytes - 1);
    std::memcpy(host.data(), name.data(), name.size());
    MPI_Allgather(host.data(), static_cast<int>(kHostBytes), MPI_CHAR, hosts.data(), static_cast<int>(kHostBytes), MPI_CHAR, MPI_COMM_WORLD);

    ProgressBoard::Layout layout;
    layout.world_rank = world_rank;
    layout.group_ranks = std::move(group_ranks);
    for (size_t r = 0; r < static_cast<size_t>(world_size); ++r) {
        layout.node_of_rank.push_back(places[2 * r]);
        layout.local_index_of_rank.push_back(places[2 * r + 1]);
        layout.host_of_rank.emplace_back(hosts.data() + r * kHostBytes);
    }

    std::shared_ptr<void> segment;
    try {
        segment = map_node_segment(node, local_rank, local_size, segment_name(leader));
    } catch (const Error&) {
        MPI_Comm_free(&node);
        throw;
    }
    MPI_Comm_free(&node);
    auto board = std::make_shared<ProgressBoard>(layout, static_cast<SharedRank*>(segment.get()), segment);
    board->set_exchange(std::make_unique<MpiProgressExchange>(*board, layout.node_of_rank));
    return board;
}

}  // namespace llmtrain
