// cuDNN's backend graph API (cudnn_graph.h), loaded with dlopen at run time like NVML
// (core/nvml.h): the binary has no link to libcudnn and starts where it is missing; the
// CUDA backend then runs its native attention kernels. Only the plain C entry points are
// used, with the few enumerators this project needs written out here (the headers are not
// needed to build; src/backend/cuda/cudnn_abi_check.cpp compares every value with them in
// a CUDA build). Enumerations travel as 32-bit ints, as in the C ABI.
//
// Which library: LLMTRAIN_CUDNN_LIBRARY (a path or a file name) when set, else
// "libcudnn.so.9" found by the dynamic loader's search (LD_LIBRARY_PATH, the ld.so cache).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace llmtrain::cudnn {

using Status = int32_t;
using Handle = void*;
using Descriptor = void*;
using Enum = int32_t;

// cudnnStatus_t
constexpr Status kSuccess = 0;
constexpr Status kNotSupported = 3000;

// cudnnDataType_t
constexpr Enum kFloat = 0, kHalf = 2, kInt32 = 4, kBFloat16 = 9, kBoolean = 11;

// cudnnBackendDescriptorType_t
constexpr Enum kPointwiseDescriptor = 0, kEngineDescriptor = 2, kEngineConfigDescriptor = 3, kEngineHeuristicsDescriptor = 4,
               kExecutionPlanDescriptor = 5, kPointwiseOperation = 13, kOperationGraphDescriptor = 15, kVariantPackDescriptor = 16,
               kTensorDescriptor = 17, kMatmulDescriptor = 18, kMatmulOperation = 19, kReductionDescriptor = 21, kReductionOperation = 22,
               kReshapeOperation = 31;

// cudnnBackendAttributeType_t
constexpr Enum kTypeHandle = 0, kTypeDataType = 1, kTypeBoolean = 2, kTypeInt64 = 3, kTypeFloat = 4, kTypeVoidPtr = 6, kTypeHeurMode = 8,
               kTypeNumericalNote = 11, kTypePointwiseMode = 14, kTypeBackendDescriptor = 15, kTypeReductionOperator = 18,
               kTypeBehaviorNote = 19;

// cudnnBackendAttributeName_t
constexpr Enum kPointwiseMode = 0, kPointwiseMathPrecision = 1, kPointwiseAxis = 9;
constexpr Enum kEngineHeuristicsMode = 200, kEngineHeuristicsGraph = 201, kEngineHeuristicsResults = 202;
constexpr Enum kEngineConfigEngine = 300;
constexpr Enum kExecutionPlanHandle = 400, kExecutionPlanEngineConfig = 401, kExecutionPlanWorkspaceSize = 402;
constexpr Enum kPointwiseOperationDescriptor = 750, kPointwiseX = 751, kPointwiseB = 752, kPointwiseY = 753, kPointwiseT = 758;
constexpr Enum kOperationGraphHandle = 800, kOperationGraphOps = 801, kOperationGraphEngineCount = 802;
constexpr Enum kTensorAlignment = 900, kTensorDataType = 901, kTensorDimensions = 902, kTensorStrides = 903, kTensorUniqueId = 906,
               kTensorIsVirtual = 907, kTensorIsByValue = 908;
constexpr Enum kVariantPackUniqueIds = 1000, kVariantPackDataPointers = 1001, kVariantPackWorkspace = 1003;
constexpr Enum kEngineOperationGraph = 1300, kEngineGlobalIndex = 1301, kEngineNumericalNote = 1303, kEngineBehaviorNote = 1305;
constexpr Enum kMatmulComputeType = 1500, kMatmulA = 1520, kMatmulB = 1521, kMatmulC = 1522, kMatmulOperationDescriptor = 1523;
constexpr Enum kReductionOperator = 1600, kReductionComputeType = 1601;
constexpr Enum kReductionX = 1610, kReductionY = 1611, kReductionOperationDescriptor = 1612;
constexpr Enum kReshapeX = 2200, kReshapeY = 2201;

// cudnnPointwiseMode_t
constexpr Enum kAdd = 0, kMul = 1, kDiv = 6, kSub = 9, kExp = 13, kLog = 15, kIdentity = 21, kCmpGe = 303, kGenIndex = 501, kBinarySelect = 601;
// cudnnReduceTensorOp_t
constexpr Enum kReduceAdd = 0, kReduceMax = 3;
// cudnnBackendHeurMode_t
constexpr Enum kHeuristicsInstant = 0, kHeuristicsB = 1, kHeuristicsFallback = 2, kHeuristicsA = 3;
// cudnnBackendNumericalNote_t
constexpr Enum kNoteTensorCore = 0, kNoteDownConvertInputs = 1, kNoteReducedPrecisionReduction = 2, kNoteFft = 3, kNoteNondeterministic = 4,
               kNoteWinograd = 5, kNoteWinograd4x4 = 6, kNoteWinograd6x6 = 7, kNoteWinograd13x13 = 8, kNoteStrictNanPropagation = 9,
               kNoteTypeCount = 10;
// cudnnBackendBehaviorNote_t
constexpr Enum kBehaviorRuntimeCompilation = 0, kBehaviorFilterInt8x32Reorder = 1, kBehaviorBiasInt8x32Reorder = 2, kBehaviorCudaGraphNative = 3,
               kBehaviorCublasLtDependency = 4, kBehaviorTypeCount = 5;

// The entry points (cudnn_graph.h), all present in every cuDNN 9.
struct Api {
    size_t (*get_version)() = nullptr;
    const char* (*get_error_string)(Status) = nullptr;
    void (*get_last_error_string)(char*, size_t) = nullptr;
    Status (*create)(Handle*) = nullptr;
    Status (*destroy)(Handle) = nullptr;
    Status (*set_stream)(Handle, void* stream) = nullptr;
    Status (*create_descriptor)(Enum type, Descriptor*) = nullptr;
    Status (*destroy_descriptor)(Descriptor) = nullptr;
    Status (*finalize)(Descriptor) = nullptr;
    Status (*set_attribute)(Descriptor, Enum name, Enum type, int64_t count, const void* values) = nullptr;
    Status (*get_attribute)(Descriptor, Enum name, Enum type, int64_t requested, int64_t* count, void* values) = nullptr;
    Status (*execute)(Handle, Descriptor plan, Descriptor variant_pack) = nullptr;
};

// A loaded libcudnn; dlclose'd when destroyed (after everything made from it).
class Library {
public:
    // Null, with why_not set to one line, where the library cannot be loaded or lacks an
    // entry point (then it is no cuDNN 9).
    static std::unique_ptr<Library> load(std::string& why_not);
    ~Library();
    Library(const Library&) = delete;
    Library& operator=(const Library&) = delete;

    const Api& api() const { return api_; }
    const std::string& path() const { return path_; }
    // "9.19.0" (cudnnGetVersion: major * 10000 + minor * 100 + patch).
    std::string version() const;
    // cuDNN's own description of its last error on this thread (cudnnGetLastErrorString),
    // and of a status: "CUDNN_STATUS_NOT_SUPPORTED: <last error>".
    std::string last_error() const;
    std::string describe(Status status) const;

private:
    Library() = default;
    void* handle_ = nullptr;
    std::string path_;
    Api api_;
};

// The library name loaded: LLMTRAIN_CUDNN_LIBRARY, else "libcudnn.so.9".
std::string library_name();

}  // namespace llmtrain::cudnn
