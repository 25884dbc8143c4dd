// Reading a checkpoint by placement (checkpoint/tensor_assembly.h), on rank files written
// here piece by piece: a rank reads any range of its layout from pieces cut another way,
// each intersection a hyperslab of its own; a padded vocabulary's extra rows read as zeros;
// and a piece missing, overlapping another or outside the global shape is an error naming
// the file, the tensor and the ranges. A rank file's attributes record the mesh, cp included.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/hdf5_file.h"
#include "checkpoint/tensor_assembly.h"
#include "support/error_text.h"

using namespace llmtrain;

namespace {

namespace fs = std::filesystem;

// Element g of the global tensor holds g (row-major, any rank): every value says where it
// came from. i: the element's place in the box, row-major.
float value_at(const Shape& global, const GlobalBox& box, int64_t i) {
    int64_t g = 0, below = 1;
    for (int d = box.count.rank - 1; d >= 0; --d) {
        g += (box.start[d] + i % box.count[d]) * below;
        i /= box.count[d];
        below *= global[d];
    }
    return static_cast<float>(g);
}

// A checkpoint directory of one rank file per list of boxes of the tensor "w".
struct FakeCheckpoint {
    std::string dir;
    Manifest manifest;

    FakeCheckpoint(const std::string& name, const Shape& global, const std::vector<std::vector<GlobalBox>>& files) {
        dir = testing::TempDir() + "pieces_" + name;
        fs::remove_all(dir);
        fs::create_directories(dir);
        for (size_t r = 0; r < files.size(); ++r) {
            RankSnapshot snapshot;
            for (const GlobalBox& box : files[r]) {
                SavedTensor t{piece_dataset(TensorRole::weights, "w", global, box), "w", global, DType::f32, {{box, 0}}, snapshot.data.size()};
                for (int64_t i = 0; i < box.numel(); ++i) {
                    const float v = value_at(global, box, i);
                    const char* bytes = reinterpret_cast<const char*>(&v);
                    snapshot.data.insert(snapshot.data.end(), bytes, bytes + sizeof v);
                }
                snapshot.tensors.push_back(t);
            }
            const std::string file = rank_file_name(static_cast<int>(r));
            write_rank_file(dir + "/" + file, snapshot, FileAttributes{1, static_cast<int>(r), static_cast<int>(files.size()), 1, static_cast<int>(files.size()), 1});
            manifest.files.push_back({file, 0, 0});
        }
        manifest.world_size = static_cast<int>(files.size());
    }
};

GlobalBox box(std::initializer_list<int64_t> start, std::initializer_list<int64_t> count) { return {Shape(start), Shape(count)}; }

}  // namespace

// Saved as two row halves; read as a tp rank's column half of rows 3-9 of the tensor.
TEST(CheckpointPieces, AnotherLayoutsRange_IsReadFromTheBoxesItMeets) {
    const Shape global{12, 4};
    const FakeCheckpoint c("rows", global, {{box({0, 0}, {6, 4})}, {box({6, 0}, {6, 4})}});
    const CheckpointTensors checkpoint(c.dir, c.manifest);
    const TensorPlace cols_half{"w", global, {12, 2}, {TpSplit::cols, 1}, 1, 2, {0, 24}};
    const FlatRange range{6, 19};  // local rows 3-9, the last one partial
    std::vector<float> out(static_cast<size_t>(range.size()), -1);
    checkpoint.read(TensorRole::weights, cols_half, range, out.data(), DType::f32);
    for (int64_t i = range.begin; i < range.end; ++i)
        EXPECT_EQ(out[static_cast<size_t>(i - range.begin)], static_cast<float>(tp_global_index({12, 2}, global, {TpSplit::cols, 1}, 1, 2, i))) << "local " << i;
}

// Expert weights, [experts, rows, cols]: saved as two experts in one file and one expert per
// piece in another; any range of the whole tensor reads back every element from its box.
TEST(CheckpointPieces, ThreeDimensionalTensor_IsReadFromPiecesCutByItsLeadingDimension) {
    const Shape global{4, 3, 5};
    const FakeCheckpoint c("experts", global, {{box({0, 0, 0}, {2, 3, 5})}, {box({2, 0, 0}, {1, 3, 5}), box({3, 0, 0}, {1, 3, 5})}});
    const CheckpointTensors checkpoint(c.dir, c.manifest);
    const TensorPlace whole{"w", global, global, {TpSplit::none, 1}, 0, 1, {0, 60}};
    for (const FlatRange range : {FlatRange{0, 60}, FlatRange{7, 53}, FlatRange{15, 45}, FlatRange{29, 31}}) {
        std::vector<float> out(static_cast<size_t>(range.size()), -1);
        checkpoint.read(TensorRole::weights, whole, range, out.data(), DType::f32);
        for (int64_t i = range.begin; i < range.end; ++i) EXPECT_EQ(out[static_cast<size_t>(i - range.begin)], static_cast<float>(i)) << "element " << i;
    }
}

// A vocabulary padded to more rows: the saved rows as they were, the new ones zero.
TEST(CheckpointPieces, PaddingRowsTheCheckpointLacks_ReadAsZeros) {
    const FakeCheckpoint c("padding", {5, 3}, {{box({0, 0}, {5, 3})}});
    const CheckpointTensors checkpoint(c.dir, c.manifest);
    const TensorPlace padded{"w", {8, 3}, {8, 3}, {}, 0, 1, {0, 24}};
    std::vector<double> out(24, -1);
    checkpoint.read(TensorRole::weights, padded, {0, 24}, out.data(), DType::f64);
    for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], i < 15 ? static_cast<double>(i) : 0.0) << i;
}

TEST(CheckpointPieces, MissingPiece_NamesTheTensorAndTheBox) {
    const FakeCheckpoint c("missing", {6, 2}, {{box({0, 0}, {2, 2})}, {box({4, 0}, {2, 2})}});
    const CheckpointTensors checkpoint(c.dir, c.manifest);
    const TensorPlace whole{"w", {6, 2}, {6, 2}, {}, 0, 1, {0, 12}};
    std::vector<float> out(12);
    const std::string message = error_of([&] { checkpoint.read(TensorRole::weights, whole, {0, 12}, out.data(), DType::f32); });
    EXPECT_NE(message.find("holds 8 of the 12 values of the weights of tensor 'w' in [0:6, 0:2] (a rank file is missing"), std::string::npos) << message;
}

TEST(CheckpointPieces, OverlappingPieces_NameBothFilesAndBoxes) {
    const FakeCheckpoint c("overlap", {6, 2}, {{box({0, 0}, {4, 2})}, {box({3, 0}, {3, 2})}});
    const CheckpointTensors checkpoint(c.dir, c.manifest);
    const TensorPlace whole{"w", {6, 2}, {6, 2}, {}, 0, 1, {0, 12}};
    std::vector<float> out(12);
    const std::string message = error_of([&] { checkpoint.read(TensorRole::weights, whole, {0, 12}, out.data(), DType::f32); });
    for (const char* part : {"is stored twice in [3:4, 0:2]", "rank_00000.h5' (model/w/0_0, [0:4, 0:2])", "rank_00001.h5' (model/w/3_0, [3:6, 0:2])"})
        EXPECT_NE(message.find(part), std::string::npos) << part << "\n" << message;
}

TEST(CheckpointPieces, BoxOutsideTheGlobalShape_NamesTheFileAndTheTensor) {
    const FakeCheckpoint c("outside", {4, 2}, {{box({0, 0}, {2, 2}), box({3, 0}, {2, 2})}});
    const std::string message = error_of([&] { CheckpointTensors(c.dir, c.manifest); });
    EXPECT_NE(message.find("rank_00000.h5': tensor 'model/w/3_0': holds the box [3:5, 0:2], outside its global shape [4, 2]"), std::string::npos) << message;
}

TEST(CheckpointPieces, AnotherShape_NamesTheFileAndBothShapes) {
    const FakeCheckpoint c("shape", {4, 2}, {{box({0, 0}, {4, 2})}});
    const CheckpointTensors checkpoint(c.dir, c.manifest);
    const TensorPlace wider{"w", {4, 3}, {4, 3}, {}, 0, 1, {0, 12}};
    std::vector<float> out(12);
    const std::string message = error_of([&] { checkpoint.read(TensorRole::weights, wider, {0, 12}, out.data(), DType::f32); });
    EXPECT_NE(message.find("rank_00000.h5': tensor 'w' is [4, 2] there and [4, 3] in this model"), std::string::npos) << message;
}

// A rank file records the whole mesh it was saved on, context parallelism included; a file of
// the first format (tests/fixtures: tp 2 x dp 2, saved before cp existed) has no mesh_cp and
// reads as cp 1.
TEST(RankFileAttributes, MeshWithCp_IsRecordedAndFilesWithoutItReadAsCp1) {
    const std::string dir = testing::TempDir() + "rank_file_mesh";
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string file = dir + "/" + rank_file_name(5);
    write_rank_file(file, RankSnapshot{}, FileAttributes{7, 5, 16, 2, 2, 2, 2});
    const FileAttributes written = RankFileReader(file, false).attributes();
    EXPECT_EQ(std::vector<int64_t>({written.step, written.world_rank, written.world_size, written.tp, written.dp, written.pp, written.cp}),
              std::vector<int64_t>({7, 5, 16, 2, 2, 2, 2}));

    ASSERT_EQ(std::system(("tar -xzf tests/fixtures/checkpoint_format_1.tar.gz -C '" + dir + "'").c_str()), 0);
    const FileAttributes old = RankFileReader(dir + "/checkpoint_format_1/step_00000003/" + rank_file_name(3), false).attributes();
    EXPECT_EQ(std::vector<int64_t>({old.step, old.world_rank, old.world_size, old.tp, old.dp, old.pp, old.cp}), std::vector<int64_t>({3, 3, 4, 2, 2, 1, 1}));
    fs::remove_all(dir);
}
