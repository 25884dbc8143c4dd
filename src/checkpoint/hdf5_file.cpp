#include "checkpoint/hdf5_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <hdf5.h>
#include <limits>
#include <sys/statvfs.h>

#include "core/checksum_policy.h"
#include "core/durable_file.h"
#include "core/error.h"

namespace llmtrain {

namespace {
constexpr const char* kFormat = "llmtrain-checkpoint-2";
constexpr const char* kFormatOne = "llmtrain-checkpoint-1";
// About 64 KiB of float32 per chunk: a flipped bit costs one chunk, checksums stay cheap,
// and a reader that needs part of a piece (another layout's) reads at most a chunk more at
// each end of it.
constexpr hsize_t kChunkElements = 16384;
// Bounds on what a reader allocates for an attribute before it is read: ours are far smaller.
constexpr hssize_t kMaxIntAttributeValues = 16;
constexpr size_t kMaxStringAttributeBytes = 4096;

// Before the first HDF5 call: HDF5 prints its error stack itself unless told not to (ours go
// into the Error instead), and its exit handler closes every file still open, which crashes
// on a file whose close failed (a full disk): files are closed by us, so it is not needed.
void silence_hdf5() {
    static const bool silenced = [] { return H5dont_atexit() >= 0 && H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr) >= 0; }();
    (void)silenced;
}

// A file that cannot fit is refused before HDF5 writes a byte of it: HDF5 recovers badly from
// a write that fails half-way. Room for the values and some metadata per tensor is asked.
void check_free_space(const std::string& path, const RankSnapshot& snapshot) {
    const std::string dir = path.substr(0, path.find_last_of('/') + 1);
    struct statvfs disk {};
    if (::statvfs(dir.empty() ? "." : dir.c_str(), &disk) != 0) fail(ErrorKind::io, "cannot create '", path, "': ", std::strerror(errno));
    const double free_bytes = static_cast<double>(disk.f_bavail) * static_cast<double>(disk.f_frsize);
    const double needed = static_cast<double>(snapshot.bytes()) + 4096.0 * static_cast<double>(snapshot.tensors.size()) + 65536.0;
    if (free_bytes < needed)
        fail(ErrorKind::io, "cannot write '", path, "': ", std::strerror(ENOSPC), " (needs about ", std::ceil(needed / 1e6), " MB, ", std::floor(free_bytes / 1e6),
             " MB free)");
}

// The innermost message of HDF5's error stack: where the system's reason is
// ("... errno = 28, error message = 'No space left on device' ...").
std::string hdf5_reason() {
    std::string reason;
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, [](unsigned n, const H5E_error2_t* e, void* out) -> herr_t {
        if (n == 0 && e->desc) *static_cast<std::string*>(out) = e->desc;
        return 0;
    }, &reason);
    H5Eclear2(H5E_DEFAULT);
    std::replace(reason.begin(), reason.end(), '\n', ' ');  // HDF5 puts ctime()'s newline in the middle
    return reason.empty() ? "HDF5 error" : reason;
}

// Closes an HDF5 handle when it goes out of scope.
class Handle {
public:
    Handle(hid_t id, herr_t (*closer)(hid_t)) : id_(id), close_(closer) {}
    ~Handle() { if (id_ >= 0) close_(id_); }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    operator hid_t() const { return id_; }
    bool ok() const { return id_ >= 0; }
    // Closes now, reporting failure (the file's last writes happen in its close).
    bool close() { const herr_t status = id_ >= 0 ? close_(id_) : 0; id_ = -1; return status >= 0; }

private:
    hid_t id_;
    herr_t (*close_)(hid_t);
};

void write_ints(hid_t object, const char* name, const std::vector<int64_t>& values) {
    const hsize_t n = std::max<size_t>(values.size(), 1);
    Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    Handle attr(H5Acreate2(object, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    const std::vector<int64_t> data = values.empty() ? std::vector<int64_t>{0} : values;
    if (!attr.ok() || H5Awrite(attr, H5T_NATIVE_INT64, data.data()) < 0) fail(ErrorKind::io, "attribute '", name, "': ", hdf5_reason());
}

void write_text(hid_t object, const char* name, const std::string& value) {
    Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type, std::max<size_t>(value.size(), 1));
    Handle space(H5Screate(H5S_SCALAR), H5Sclose);
    Handle attr(H5Acreate2(object, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    const std::string data = value.empty() ? std::string(1, '\0') : value;
    if (!attr.ok() || H5Awrite(attr, type, data.data()) < 0) fail(ErrorKind::io, "attribute '", name, "': ", hdf5_reason());
}

std::vector<int64_t> read_int_attribute(hid_t object, const char* name) {
    Handle attr(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
    if (!attr.ok()) fail(ErrorKind::data, "attribute '", name, "' is missing");
    Handle space(H5Aget_space(attr), H5Sclose);
    const hssize_t n = H5Sget_simple_extent_npoints(space);
    // Ours hold a shape, a hyperslab per dimension or a few counts: a longer one is not ours.
    if (n > kMaxIntAttributeValues) fail(ErrorKind::data, "attribute '", name, "' holds ", n, " values (at most ", kMaxIntAttributeValues, " expected)");
    std::vector<int64_t> values(static_cast<size_t>(std::max<hssize_t>(n, 0)));
    if (n <= 0 || H5Aread(attr, H5T_NATIVE_INT64, values.data()) < 0) fail(ErrorKind::data, "attribute '", name, "' is unreadable");
    return values;
}

std::string read_string_attribute(hid_t object, const char* name) {
    Handle attr(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
    if (!attr.ok()) fail(ErrorKind::data, "attribute '", name, "' is missing");
    Handle type(H5Aget_type(attr), H5Tclose);
    Handle space(H5Aget_space(attr), H5Sclose);
    // One fixed-length string, as written: a variable-length one would be read as a pointer.
    const size_t size = H5Tget_size(type);
    if (H5Tget_class(type) != H5T_STRING || H5Tis_variable_str(type) != 0 || H5Sget_simple_extent_npoints(space) != 1 || size > kMaxStringAttributeBytes)
        fail(ErrorKind::data, "attribute '", name, "' is not one string of at most ", kMaxStringAttributeBytes, " bytes");
    std::string value(size, '\0');
    if (H5Aread(attr, type, value.data()) < 0) fail(ErrorKind::data, "attribute '", name, "' is unreadable");
    value.resize(std::strlen(value.c_str()));
    return value;
}

std::vector<int64_t> dims_of(const Shape& shape) { return {shape.dims.begin(), shape.dims.begin() + shape.rank}; }

// A shape (or a hyperslab's start or extent) attribute: at most Shape::max_rank dimensions,
// none negative, and a product that fits in int64_t.
Shape shape_of(const std::vector<int64_t>& dims, const char* name) {
    if (dims.size() > static_cast<size_t>(Shape::max_rank)) fail(ErrorKind::data, "attribute '", name, "' has ", dims.size(), " dimensions (at most ", Shape::max_rank, ")");
    Shape shape;
    shape.rank = static_cast<int>(dims.size());
    int64_t numel = 1;
    for (int i = 0; i < shape.rank; ++i) {
        const int64_t dim = dims[static_cast<size_t>(i)];
        if (dim < 0 || (dim > 0 && numel > std::numeric_limits<int64_t>::max() / dim))
            fail(ErrorKind::data, "attribute '", name, "': dimension ", i, " is ", dim, " (negative, or the shape overflows)");
        numel *= dim;
        shape.dims[static_cast<size_t>(i)] = dim;
    }
    return shape;
}

const char* split_name(TpSplit split) { return split == TpSplit::rows ? "rows" : split == TpSplit::cols ? "cols" : "none"; }

TpSplit parse_split(const std::string& name) {
    if (name == "rows") return TpSplit::rows;
    if (name == "cols") return TpSplit::cols;
    if (name == "none") return TpSplit::none;
    fail(ErrorKind::data, "attribute 'tp_split' is '", name, "' (expected none, rows or cols)");
}

// The box a piece holds, as an HDF5 hyperslab of the global tensor: start, stride 1, count
// 1, block = the box's extent.
void write_hyperslab(hid_t object, const GlobalBox& box) {
    const std::vector<int64_t> start = dims_of(box.start), block = dims_of(box.count);
    write_ints(object, "hyperslab_start", start);
    write_ints(object, "hyperslab_stride", std::vector<int64_t>(start.size(), 1));
    write_ints(object, "hyperslab_count", std::vector<int64_t>(start.size(), 1));
    write_ints(object, "hyperslab_block", block);
}

void write_tensor(hid_t file, hid_t link_properties, const SavedTensor& t, const char* data) {
    if (t.boxes.size() != 1) fail(ErrorKind::runtime, "tensor '", t.dataset, "': a piece is written as one box");
    const GlobalBox& box = t.boxes.front().box;
    std::vector<hsize_t> dims;
    for (int i = 0; i < box.count.rank; ++i) dims.push_back(static_cast<hsize_t>(box.count[i]));
    if (dims.empty()) dims.push_back(1);
    // Chunks of whole rows of about kChunkElements elements.
    std::vector<hsize_t> chunk = dims;
    const hsize_t row = dims.size() > 1 ? static_cast<hsize_t>(t.numel()) / std::max<hsize_t>(dims[0], 1) : 1;
    chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(dims[0], kChunkElements / std::max<hsize_t>(row, 1)));
    Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
    Handle create(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_chunk(create, static_cast<int>(chunk.size()), chunk.data());
    H5Pset_fletcher32(create);
    const bool f64 = t.dtype == DType::f64;
    Handle dataset(H5Dcreate2(file, t.dataset.c_str(), f64 ? H5T_IEEE_F64LE : H5T_IEEE_F32LE, space, link_properties, create, H5P_DEFAULT), H5Dclose);
    if (!dataset.ok() || H5Dwrite(dataset, f64 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
        fail(ErrorKind::io, "tensor '", t.dataset, "': ", hdf5_reason());
    write_text(dataset, "name", t.name);
    write_ints(dataset, "global_shape", dims_of(t.global_shape));
    write_hyperslab(dataset, box);
}

// How a tp rank's part sits in the global tensor, as boxes_of places its values: the same
// rank, and a split dimension that is the local one times tp_size (rows: in whole blocks of
// at least one row), as Parameters::add requires; unsplit, the same shape.
void check_tp_layout(const TensorPlace& t) {
    const Shape& local = t.local_shape;
    const Shape& global = t.global_shape;
    if (t.tp_size < 1 || t.tp_rank < 0 || t.tp_rank >= t.tp_size)
        fail(ErrorKind::data, "attributes 'tp_rank' ", t.tp_rank, " and 'tp_size' ", t.tp_size, " (expected 0 <= tp_rank < tp_size)");
    const bool split = t.split.kind != TpSplit::none && t.tp_size > 1;
    if (!split) {
        if (local != global) fail(ErrorKind::data, "local_shape ", local.str(), " is not global_shape ", global.str(), " of an unsplit tensor");
        return;
    }
    const bool rows = t.split.kind == TpSplit::rows;
    if (local.rank != global.rank || global.rank < (rows ? 1 : 2))
        fail(ErrorKind::data, "local_shape ", local.str(), " and global_shape ", global.str(), " do not fit a ", split_name(t.split.kind), " split");
    const int split_dim = rows ? 0 : global.rank - 1;
    for (int i = 0; i < global.rank; ++i) {
        const bool fits = i == split_dim ? local[i] >= 1 && global[i] % t.tp_size == 0 && global[i] / t.tp_size == local[i] : local[i] == global[i];
        if (!fits)
            fail(ErrorKind::data, "local_shape ", local.str(), " is not global_shape ", global.str(), " split ", t.tp_size, " ways by ", split_name(t.split.kind));
    }
    if (rows && (t.split.blocks < 1 || local[0] % t.split.blocks != 0 || (global.rank >= 2 && global.cols() < 1)))
        fail(ErrorKind::data, "attribute 'tp_blocks' is ", t.split.blocks, ", which does not divide the ", local[0], " local rows");
}

int int_attribute(hid_t object, const char* name) {
    const int64_t value = read_int_attribute(object, name).at(0);
    if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max())
        fail(ErrorKind::data, "attribute '", name, "' is ", value, " (beyond an int)");
    return static_cast<int>(value);
}

// A dataset of the first format: a range [begin, end) of one tp rank's part of a tensor,
// described by the attributes of that layout; the boxes it holds follow from the tp split.
// `stored` is the dataset's number of values: the range must be as long before its boxes are
// listed (a forged range of a huge part would list boxes without end).
std::vector<StoredBox> boxes_of_format_one(hid_t object, const std::string& name, const Shape& global_shape, int64_t stored) {
    TensorPlace part;
    part.name = name;
    part.global_shape = global_shape;
    part.local_shape = shape_of(read_int_attribute(object, "local_shape"), "local_shape");
    part.split = {parse_split(read_string_attribute(object, "tp_split")), read_int_attribute(object, "tp_blocks").at(0)};
    part.tp_rank = int_attribute(object, "tp_rank");
    part.tp_size = int_attribute(object, "tp_size");
    check_tp_layout(part);
    part.flat = {0, part.local_shape.numel()};
    const std::vector<int64_t> elements = read_int_attribute(object, "local_elements");
    if (elements.size() != 2 || elements[0] < 0 || elements[1] > part.flat.end || elements[0] > elements[1])
        fail(ErrorKind::data, "attribute 'local_elements' is not a range of the ", part.flat.end, " local elements");
    if (elements[1] - elements[0] != stored)
        fail(ErrorKind::data, "holds ", stored, " values, its attributes say ", elements[1] - elements[0]);
    std::vector<StoredBox> boxes;
    int64_t offset = 0;
    for (const GlobalBox& box : boxes_of(part, {elements[0], elements[1]})) {
        boxes.push_back({box, offset});
        offset += box.numel();
    }
    return boxes;
}

// A dataset of this format: one box, given as a hyperslab of one block.
std::vector<StoredBox> boxes_of_format_two(hid_t object) {
    const std::vector<int64_t> start = read_int_attribute(object, "hyperslab_start"), count = read_int_attribute(object, "hyperslab_count"),
                               block = read_int_attribute(object, "hyperslab_block");
    if (start.size() != block.size() || count.size() != block.size() || start.size() > Shape::max_rank)
        fail(ErrorKind::data, "hyperslab attributes of ", start.size(), ", ", count.size(), " and ", block.size(), " dimensions");
    for (int64_t c : count)
        if (c != 1) fail(ErrorKind::data, "attribute 'hyperslab_count' is not 1 in every dimension (a piece is one block)");
    return {{GlobalBox{shape_of(start, "hyperslab_start"), shape_of(block, "hyperslab_block")}, 0}};
}

}  // namespace

void write_rank_file(const std::string& path, const RankSnapshot& snapshot, const FileAttributes& attributes,
                     const std::function<void()>& between_tensors) {
    silence_hdf5();
    check_free_space(path, snapshot);
    Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!file.ok()) fail(ErrorKind::io, "cannot create '", path, "': ", hdf5_reason());
    try {
        write_text(file, "format", kFormat);
        write_ints(file, "step", {attributes.step});
        write_ints(file, "world_rank", {attributes.world_rank});
        write_ints(file, "world_size", {attributes.world_size});
        write_ints(file, "mesh_tp_dp_pp", {attributes.tp, attributes.dp, attributes.pp});
        write_ints(file, "mesh_cp", {attributes.cp});
        Handle links(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
        H5Pset_create_intermediate_group(links, 1);
        for (const SavedTensor& t : snapshot.tensors) {
            write_tensor(file, links, t, snapshot.data.data() + t.byte_offset);
            if (between_tensors) between_tensors();
        }
    } catch (const Error& e) {
        fail(ErrorKind::io, "cannot write '", path, "': ", e.what());
    }
    if (!file.close()) fail(ErrorKind::io, "cannot write '", path, "': ", hdf5_reason());
    fsync_file(path);
}

int rank_file_format(const std::string& format_attribute) {
    if (format_attribute == kFormat) return 2;
    if (format_attribute == kFormatOne) return 1;
    fail(ErrorKind::data, "format '", format_attribute, "' is not one this llmtrain reads (", kFormat, ", ", kFormatOne, ")");
}

RankFileReader::RankFileReader(const std::string& path, bool index) : path_(path) {
    silence_hdf5();
    if (H5Fis_hdf5(path.c_str()) <= 0) fail(ErrorKind::data, "'", path, "' is not an HDF5 file (truncated or damaged?)");
    file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file_ < 0) fail(ErrorKind::data, "cannot open '", path, "': ", hdf5_reason());
    try {
        const std::string format = read_string_attribute(file_, "format");
        if (!format.starts_with("llmtrain-checkpoint-")) fail(ErrorKind::data, "not an llmtrain checkpoint file (attribute 'format')");
        format_ = rank_file_format(format);
        attributes_.step = read_int_attribute(file_, "step").at(0);
        attributes_.world_rank = static_cast<int>(read_int_attribute(file_, "world_rank").at(0));
        attributes_.world_size = static_cast<int>(read_int_attribute(file_, "world_size").at(0));
        const std::vector<int64_t> mesh = read_int_attribute(file_, "mesh_tp_dp_pp");
        if (mesh.size() != 3) fail(ErrorKind::data, "attribute 'mesh_tp_dp_pp' does not hold 3 values");
        attributes_.tp = static_cast<int>(mesh[0]), attributes_.dp = static_cast<int>(mesh[1]), attributes_.pp = static_cast<int>(mesh[2]);
        if (H5Aexists(file_, "mesh_cp") > 0) attributes_.cp = static_cast<int>(read_int_attribute(file_, "mesh_cp").at(0));
        if (!index) return;
        hsize_t file_bytes = 0;
        if (H5Fget_filesize(file_, &file_bytes) < 0) fail(ErrorKind::data, "its size is unreadable: ", hdf5_reason());
        std::vector<std::string> names;
        H5Lvisit(file_, H5_INDEX_NAME, H5_ITER_INC, [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
            static_cast<std::vector<std::string>*>(out)->push_back(name);
            return 0;
        }, &names);
        for (const std::string& name : names) {
            Handle object(H5Oopen(file_, name.c_str(), H5P_DEFAULT), H5Oclose);
            if (!object.ok()) fail(ErrorKind::data, "object '", name, "' is unreadable: ", hdf5_reason());
            if (H5Iget_type(object) != H5I_DATASET) continue;
            try {
                SavedTensor t;
                t.dataset = name;
                t.name = read_string_attribute(object, "name");
                t.global_shape = shape_of(read_int_attribute(object, "global_shape"), "global_shape");
                // Exactly the types and layout written: libhdf5 1.10 reads past a chunk whose
                // stored bytes are fewer than its elements of another size need.
                Handle type(H5Dget_type(object), H5Tclose);
                const bool f32 = H5Tequal(type, H5T_IEEE_F32LE) > 0, f64 = H5Tequal(type, H5T_IEEE_F64LE) > 0;
                if (!f32 && !f64) fail(ErrorKind::data, "is not of little-endian IEEE float32 or float64 values");
                t.dtype = f64 ? DType::f64 : DType::f32;
                Handle create(H5Dget_create_plist(object), H5Pclose);
                if (!create.ok() || H5Pget_layout(create) != H5D_CHUNKED) fail(ErrorKind::data, "is not stored in chunks");
                Handle space(H5Dget_space(object), H5Sclose);
                const hssize_t stored = H5Sget_simple_extent_npoints(space);
                // Every value is written, so the file holds them all: a larger extent would
                // have the reader allocate memory that the file does not justify.
                if (stored < 0 || static_cast<uint64_t>(stored) > file_bytes / dtype_size(t.dtype))
                    fail(ErrorKind::data, "holds ", stored, " values of ", dtype_size(t.dtype), " bytes, more than the file's ", file_bytes, " bytes");
                t.boxes = format_ == 1 ? boxes_of_format_one(object, t.name, t.global_shape, stored) : boxes_of_format_two(object);
                if (stored != t.numel()) fail(ErrorKind::data, "holds ", stored, " values, its attributes say ", t.numel());
                for (const StoredBox& b : t.boxes)
                    if (!b.box.inside(t.global_shape)) fail(ErrorKind::data, "holds the box ", b.box.str(), ", outside its global shape ", t.global_shape.str());
                tensors_.push_back(std::move(t));
            } catch (const Error& e) {
                fail(ErrorKind::data, "tensor '", name, "': ", e.what());
            }
        }
    } catch (const Error& e) {
        H5Fclose(file_);
        file_ = -1;
        fail(ErrorKind::data, "'", path, "': ", e.what());
    }
}

RankFileReader::~RankFileReader() {
    if (file_ >= 0) H5Fclose(file_);
}

namespace {
hid_t native_type(DType dtype) {
    if (dtype == DType::f64) return H5T_NATIVE_DOUBLE;
    if (dtype == DType::f32) return H5T_NATIVE_FLOAT;
    fail(ErrorKind::unsupported, "checkpoint values read as ", dtype_name(dtype), " (expected f32 or f64)");
}

// The transfer properties of every read: HDF5's default (Fletcher32 verified), or in the
// fuzzing build checksums skipped so that mutations reach what lies behind them.
class TransferProperties {
public:
    TransferProperties() : id_(H5Pcreate(H5P_DATASET_XFER)) {
        if (!kChecksumsEnforced) H5Pset_edc_check(id_, H5Z_DISABLE_EDC);
    }
    ~TransferProperties() { if (id_ >= 0) H5Pclose(id_); }
    TransferProperties(const TransferProperties&) = delete;
    TransferProperties& operator=(const TransferProperties&) = delete;
    hid_t id() const { return id_ >= 0 ? id_ : H5P_DEFAULT; }

private:
    hid_t id_;
};

TransferProperties checked_transfer() { return {}; }

// libhdf5 1.10 copies a chunk's whole size out of whatever its filters returned: a chunk
// stored shorter than written (a damaged file, or a hostile one whose Fletcher32 checksums
// were recomputed) is read past its end. So every chunk a read touches (the selection
// [start, start + count) of the dataset, clipped to its extent; none given: all of it) must be
// stored exactly as written: its values, behind Fletcher32 their 4-byte checksum, through no
// other filter. One B-tree lookup per chunk, next to reading the chunk itself. `where` starts
// the error ("'FILE': tensor 'NAME' ").
void check_stored_chunks(hid_t dataset, const std::string& where, std::vector<hsize_t> start = {}, std::vector<hsize_t> count = {}) {
    Handle create(H5Dget_create_plist(dataset), H5Pclose);
    Handle type(H5Dget_type(dataset), H5Tclose);
    Handle space(H5Dget_space(dataset), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space);
    if (rank < 0 || rank > Shape::max_rank) fail(ErrorKind::data, where, "has ", rank, " dimensions");
    std::vector<hsize_t> extent(static_cast<size_t>(rank)), chunk(static_cast<size_t>(rank));
    if (H5Sget_simple_extent_dims(space, extent.data(), nullptr) < 0 || H5Pget_chunk(create, rank, chunk.data()) != rank)
        fail(ErrorKind::data, where, "has no readable chunk layout");
    if (start.empty()) start.assign(extent.size(), 0), count = extent;
    if (start.size() != extent.size() || count.size() != extent.size()) fail(ErrorKind::data, where, "has ", rank, " dimensions, not ", start.size());
    bool fletcher32 = false;
    for (int f = 0; f < H5Pget_nfilters(create); ++f) {
        unsigned flags = 0, filter_config = 0;
        size_t values = 0;
        const H5Z_filter_t filter = H5Pget_filter2(create, static_cast<unsigned>(f), &flags, &values, nullptr, 0, nullptr, &filter_config);
        if (filter != H5Z_FILTER_FLETCHER32 || fletcher32) fail(ErrorKind::data, where, "is stored through filter ", filter, " (written with Fletcher32 only)");
        fletcher32 = true;
    }
    hsize_t expected = H5Tget_size(type);
    for (hsize_t c : chunk) expected *= c;
    if (fletcher32) expected += 4;
    // The chunk grid cells the selection touches, odometer order.
    std::vector<hsize_t> first(chunk.size()), last(chunk.size());
    for (size_t d = 0; d < chunk.size(); ++d) {
        const hsize_t end = std::min(extent[d], start[d] + count[d]);
        if (chunk[d] == 0 || count[d] == 0 || start[d] >= end) return;
        first[d] = start[d] / chunk[d], last[d] = (end - 1) / chunk[d];
    }
    std::vector<hsize_t> cell = first, offset(chunk.size());
    for (;;) {
        for (size_t d = 0; d < chunk.size(); ++d) offset[d] = cell[d] * chunk[d];
        hsize_t stored = 0;
        if (H5Dget_chunk_storage_size(dataset, offset.data(), &stored) < 0 || stored != expected)
            fail(ErrorKind::data, where, "a chunk holds ", stored, " bytes, ", expected, " as written (damaged, or not written by llmtrain)");
        size_t d = chunk.size();
        while (d > 0 && cell[d - 1] == last[d - 1]) cell[d - 1] = first[d - 1], --d;
        if (d == 0) return;
        ++cell[d - 1];
    }
}

std::vector<hsize_t> hsizes(const Shape& shape) {
    std::vector<hsize_t> out;
    for (int d = 0; d < shape.rank; ++d) out.push_back(static_cast<hsize_t>(shape[d]));
    return out;
}
}  // namespace

std::vector<double> RankFileReader::read(const SavedTensor& tensor) const {
    std::vector<double> values(static_cast<size_t>(tensor.numel()));
    read_all(tensor, values.data(), DType::f64);
    return values;
}

void RankFileReader::read_all(const SavedTensor& tensor, void* out, DType as) const {
    Handle dataset(H5Dopen2(file_, tensor.dataset.c_str(), H5P_DEFAULT), H5Dclose);
    if (!dataset.ok()) fail(ErrorKind::data, "'", path_, "': tensor '", tensor.dataset, "' cannot be opened (", hdf5_reason(), ")");
    check_stored_chunks(dataset, cat("'", path_, "': tensor '", tensor.dataset, "' "));
    // Every chunk's Fletcher32 checksum is verified by this read (the fuzzing build has HDF5
    // skip them: core/checksum_policy.h).
    if (H5Dread(dataset, native_type(as), H5S_ALL, H5S_ALL, checked_transfer().id(), out) < 0)
        fail(ErrorKind::data, "'", path_, "': tensor '", tensor.dataset, "' is damaged (", hdf5_reason(), ")");
}

void RankFileReader::read_part(const SavedTensor& tensor, const GlobalBox& part, void* out, DType as, const Shape& out_shape, const Shape& out_start) const {
    if (format_ < 2 || tensor.boxes.size() != 1) fail(ErrorKind::runtime, "'", path_, "': tensor '", tensor.dataset, "' is not shaped as one box: read it whole");
    const GlobalBox& box = tensor.boxes.front().box;
    Handle dataset(H5Dopen2(file_, tensor.dataset.c_str(), H5P_DEFAULT), H5Dclose);
    if (!dataset.ok()) fail(ErrorKind::data, "'", path_, "': tensor '", tensor.dataset, "' cannot be opened (", hdf5_reason(), ")");
    Handle file_space(H5Dget_space(dataset), H5Sclose);
    std::vector<hsize_t> start, count = hsizes(part.count);
    for (int d = 0; d < part.start.rank; ++d) start.push_back(static_cast<hsize_t>(part.start[d] - box.start[d]));
    const std::vector<hsize_t> memory_dims = hsizes(out_shape), memory_start = hsizes(out_start);
    Handle memory_space(H5Screate_simple(static_cast<int>(memory_dims.size()), memory_dims.data(), nullptr), H5Sclose);
    if (H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0 ||
        H5Sselect_hyperslab(memory_space, H5S_SELECT_SET, memory_start.data(), nullptr, count.data(), nullptr) < 0)
        fail(ErrorKind::data, "'", path_, "': tensor '", tensor.dataset, "': the part ", part.str(), " is outside its box ", box.str());
    check_stored_chunks(dataset, cat("'", path_, "': tensor '", tensor.dataset, "' "), start, count);
    // The chunks this part touches are read whole and their checksums verified.
    if (H5Dread(dataset, native_type(as), memory_space, file_space, checked_transfer().id(), out) < 0)
        fail(ErrorKind::data, "'", path_, "': tensor '", tensor.dataset, "' is damaged (", hdf5_reason(), ")");
}

}  // namespace llmtrain
