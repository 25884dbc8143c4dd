/* A stand-in for libcudnn.so.9 (cuDNN 9's backend graph API) that computes nothing and
 * records what it is given, so that CPU tests check the graphs llmtrain builds: every
 * descriptor's attributes, each finalized operation graph (its operations in order and
 * the tensors they connect), the plans tried and the variant packs executed. It answers
 * the queries a plan search makes (heuristics results, engine notes, workspace sizes).
 *
 * FAKE_CUDNN_MODE chooses its engines (read at every call):
 *   ""                     heuristics offer engine 7 (nondeterministic) then engine 8
 *                          (deterministic, tensor cores, runtime compiled); both finalize
 *   no_engine              every plan fails to finalize (CUDNN_STATUS_NOT_SUPPORTED)
 *   nondeterministic_only  every engine, offered or enumerated, is nondeterministic
 *   reject_int32_mask      a graph with GEN_INDEX in int32 does not finalize
 *
 * fake_cudnn_log() returns the record, one line per event:
 *   graph G ops N
 *   op G pointwise mode M prec P axis A x U b U t U y U | op G matmul a U b U c U comp T
 *   op G reduction op R comp T x U y U | op G reshape x U y U
 *   tensor G uid U dtype D dims a,b,c,d strides a,b,c,d virtual V by_value V align A
 *   plan G engine E status S
 *   pack 0                            (a variant pack finalized)
 *   execute G uid U ptr P [value F]   (one line per binding; F for by-value floats)
 * fake_cudnn_reset() empties it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int32_t cudnnStatus_t;
enum { SUCCESS = 0, BAD_PARAM = 2000, NOT_SUPPORTED = 3000 };
enum { T_POINTWISE = 0, T_ENGINE = 2, T_ENGINECFG = 3, T_ENGINEHEUR = 4, T_PLAN = 5, T_OP_POINTWISE = 13, T_GRAPH = 15, T_VARIANT_PACK = 16,
       T_TENSOR = 17, T_MATMUL = 18, T_OP_MATMUL = 19, T_REDUCTION = 21, T_OP_REDUCTION = 22, T_OP_RESHAPE = 31 };
enum { A_HEUR_RESULTS = 202, A_CFG_ENGINE = 300, A_PLAN_CONFIG = 401, A_PLAN_WORKSPACE = 402, A_GRAPH_OPS = 801, A_GRAPH_ENGINE_COUNT = 802,
       A_TENSOR_ALIGN = 900, A_TENSOR_DTYPE = 901, A_TENSOR_DIMS = 902, A_TENSOR_STRIDES = 903, A_TENSOR_UID = 906, A_TENSOR_VIRTUAL = 907,
       A_TENSOR_BY_VALUE = 908, A_PACK_UIDS = 1000, A_PACK_POINTERS = 1001, A_ENGINE_GRAPH = 1300, A_ENGINE_INDEX = 1301,
       A_ENGINE_NUMERICAL = 1303, A_ENGINE_BEHAVIOR = 1305, A_PW_MODE = 0, A_PW_PREC = 1, A_PW_AXIS = 9, A_OP_PW = 750, A_OP_PW_X = 751,
       A_OP_PW_B = 752, A_OP_PW_Y = 753, A_OP_PW_T = 758, A_MM_COMP = 1500, A_OP_MM_A = 1520, A_OP_MM_B = 1521, A_OP_MM_C = 1522,
       A_OP_MM_DESC = 1523, A_RED_OP = 1600, A_RED_COMP = 1601, A_OP_RED_X = 1610, A_OP_RED_Y = 1611, A_OP_RED_DESC = 1612,
       A_RESHAPE_X = 2200, A_RESHAPE_Y = 2201 };
enum { GEN_INDEX = 501, DATA_INT32 = 4, NOTE_TENSOR_CORE = 0, NOTE_NONDETERMINISTIC = 4, BEHAVIOR_RUNTIME_COMPILATION = 0 };

#define MAX_ATTRS 24
typedef struct {
    int32_t name, type;
    int64_t count;
    unsigned char* bytes;
} Attr;

typedef struct Desc {
    int32_t type;
    int finalized;
    int graph_id;        /* operation graphs: their number in the log */
    int64_t engine;      /* engines and configurations: the engine's index */
    Attr attrs[MAX_ATTRS];
    int n_attrs;
} Desc;

static char* log_text = NULL;
static size_t log_length = 0, log_capacity = 0;
static int graphs_made = 0;
static char last_error[512] = "";

static void say(const char* format, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void say(const char* format, ...) {
    char line[1024];
    va_list args;
    va_start(args, format);
    const int n = vsnprintf(line, sizeof line, format, args);
    va_end(args);
    if (n < 0) return;
    const size_t need = log_length + (size_t)n + 2;
    if (need > log_capacity) {
        log_capacity = need * 2;
        log_text = realloc(log_text, log_capacity);
    }
    memcpy(log_text + log_length, line, (size_t)n);
    log_length += (size_t)n;
    log_text[log_length++] = '\n';
    log_text[log_length] = '\0';
}

const char* fake_cudnn_log(void) { return log_text ? log_text : ""; }
void fake_cudnn_reset(void) {
    log_length = 0;
    if (log_text) log_text[0] = '\0';
}

static int mode_is(const char* mode) {
    const char* m = getenv("FAKE_CUDNN_MODE");
    return strcmp(m ? m : "", mode) == 0;
}

static cudnnStatus_t error(cudnnStatus_t status, const char* message) {
    snprintf(last_error, sizeof last_error, "%s", message);
    return status;
}

static Attr* find(Desc* d, int32_t name) {
    for (int i = 0; i < d->n_attrs; ++i)
        if (d->attrs[i].name == name) return &d->attrs[i];
    return NULL;
}

static int64_t int64_of(Desc* d, int32_t name, int64_t otherwise) {
    Attr* a = find(d, name);
    if (!a) return otherwise;
    if (a->count >= 1 && (a->type == 3)) { int64_t v; memcpy(&v, a->bytes, sizeof v); return v; }
    if (a->count >= 1) { int32_t v; memcpy(&v, a->bytes, sizeof v); return v; }
    return otherwise;
}

static Desc* desc_of(Desc* d, int32_t name, int64_t i) {
    Attr* a = find(d, name);
    if (!a || i >= a->count) return NULL;
    Desc* out;
    memcpy(&out, a->bytes + i * (int64_t)sizeof(void*), sizeof out);
    return out;
}

static int64_t uid_of(Desc* tensor) { return tensor ? int64_of(tensor, A_TENSOR_UID, -1) : -1; }

static size_t element_size(int32_t type) {
    switch (type) {
        case 0: return sizeof(void*);   /* handle */
        case 2: return 1;               /* bool */
        case 3: return 8;               /* int64 */
        case 4: return 4;               /* float */
        case 5: return 8;               /* double */
        case 6: case 15: return sizeof(void*);
        default: return 4;              /* enumerations */
    }
}

size_t cudnnGetVersion(void) { return 91900; }
const char* cudnnGetErrorString(cudnnStatus_t s) {
    return s == SUCCESS ? "CUDNN_STATUS_SUCCESS" : s == NOT_SUPPORTED ? "CUDNN_STATUS_NOT_SUPPORTED" : "CUDNN_STATUS_BAD_PARAM";
}
void cudnnGetLastErrorString(char* message, size_t max_size) {
    if (max_size == 0) return;
    snprintf(message, max_size, "%s", last_error);
    last_error[0] = '\0';
}
cudnnStatus_t cudnnCreate(void** handle) { static int fake_handle; *handle = &fake_handle; return SUCCESS; }
cudnnStatus_t cudnnDestroy(void* handle) { (void)handle; return SUCCESS; }
cudnnStatus_t cudnnSetStream(void* handle, void* stream) { (void)handle; (void)stream; return SUCCESS; }

cudnnStatus_t cudnnBackendCreateDescriptor(int32_t type, void** descriptor) {
    Desc* d = calloc(1, sizeof(Desc));
    d->type = type;
    d->engine = -1;
    *descriptor = d;
    return SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(void* descriptor) {
    Desc* d = descriptor;
    for (int i = 0; i < d->n_attrs; ++i) free(d->attrs[i].bytes);
    free(d);
    return SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(void* descriptor, int32_t name, int32_t type, int64_t count, const void* values) {
    Desc* d = descriptor;
    if (d->finalized) return error(BAD_PARAM, "fake cuDNN: attribute set on a finalized descriptor");
    if (count < 0 || (count > 0 && !values)) return error(BAD_PARAM, "fake cuDNN: no values");
    Attr* a = find(d, name);
    if (!a) {
        if (d->n_attrs == MAX_ATTRS) return error(BAD_PARAM, "fake cuDNN: too many attributes");
        a = &d->attrs[d->n_attrs++];
    } else {
        free(a->bytes);
    }
    const size_t bytes = element_size(type) * (size_t)count;
    a->name = name, a->type = type, a->count = count;
    a->bytes = malloc(bytes ? bytes : 1);
    if (bytes) memcpy(a->bytes, values, bytes);
    return SUCCESS;
}

static void log_tensor(int graph, Desc* t) {
    int64_t dims[4] = {0}, strides[4] = {0};
    Attr* a = find(t, A_TENSOR_DIMS);
    if (a && a->count == 4) memcpy(dims, a->bytes, sizeof dims);
    a = find(t, A_TENSOR_STRIDES);
    if (a && a->count == 4) memcpy(strides, a->bytes, sizeof strides);
    Attr* v = find(t, A_TENSOR_VIRTUAL);
    Attr* bv = find(t, A_TENSOR_BY_VALUE);
    say("tensor %d uid %lld dtype %lld dims %lld,%lld,%lld,%lld strides %lld,%lld,%lld,%lld virtual %d by_value %d align %lld", graph,
        (long long)uid_of(t), (long long)int64_of(t, A_TENSOR_DTYPE, -1), (long long)dims[0], (long long)dims[1], (long long)dims[2],
        (long long)dims[3], (long long)strides[0], (long long)strides[1], (long long)strides[2], (long long)strides[3], v ? v->bytes[0] : 0,
        bv ? bv->bytes[0] : 0, (long long)int64_of(t, A_TENSOR_ALIGN, -1));
}

/* Each tensor of the graph once, in the order the operations name them. */
static void log_tensors(int graph, Desc** ops, int64_t n) {
    Desc* seen[512];
    int n_seen = 0;
    static const int32_t ports[] = {A_OP_PW_X, A_OP_PW_B, A_OP_PW_T, A_OP_PW_Y, A_OP_MM_A, A_OP_MM_B, A_OP_MM_C, A_OP_RED_X, A_OP_RED_Y,
                                    A_RESHAPE_X, A_RESHAPE_Y};
    for (int64_t i = 0; i < n; ++i)
        for (size_t p = 0; p < sizeof ports / sizeof ports[0]; ++p) {
            Desc* t = desc_of(ops[i], ports[p], 0);
            if (!t) continue;
            int known = 0;
            for (int k = 0; k < n_seen; ++k) known |= seen[k] == t;
            if (known || n_seen == 512) continue;
            seen[n_seen++] = t;
            log_tensor(graph, t);
        }
}

static void log_op(int graph, Desc* op) {
    if (op->type == T_OP_POINTWISE) {
        Desc* pw = desc_of(op, A_OP_PW, 0);
        say("op %d pointwise mode %lld prec %lld axis %lld x %lld b %lld t %lld y %lld", graph, (long long)int64_of(pw, A_PW_MODE, -1),
            (long long)int64_of(pw, A_PW_PREC, -1), (long long)int64_of(pw, A_PW_AXIS, -1), (long long)uid_of(desc_of(op, A_OP_PW_X, 0)),
            (long long)uid_of(desc_of(op, A_OP_PW_B, 0)), (long long)uid_of(desc_of(op, A_OP_PW_T, 0)), (long long)uid_of(desc_of(op, A_OP_PW_Y, 0)));
    } else if (op->type == T_OP_MATMUL) {
        say("op %d matmul a %lld b %lld c %lld comp %lld", graph, (long long)uid_of(desc_of(op, A_OP_MM_A, 0)), (long long)uid_of(desc_of(op, A_OP_MM_B, 0)),
            (long long)uid_of(desc_of(op, A_OP_MM_C, 0)), (long long)int64_of(desc_of(op, A_OP_MM_DESC, 0), A_MM_COMP, -1));
    } else if (op->type == T_OP_REDUCTION) {
        Desc* r = desc_of(op, A_OP_RED_DESC, 0);
        say("op %d reduction op %lld comp %lld x %lld y %lld", graph, (long long)int64_of(r, A_RED_OP, -1), (long long)int64_of(r, A_RED_COMP, -1),
            (long long)uid_of(desc_of(op, A_OP_RED_X, 0)), (long long)uid_of(desc_of(op, A_OP_RED_Y, 0)));
    } else if (op->type == T_OP_RESHAPE) {
        say("op %d reshape x %lld y %lld", graph, (long long)uid_of(desc_of(op, A_RESHAPE_X, 0)), (long long)uid_of(desc_of(op, A_RESHAPE_Y, 0)));
    } else {
        say("op %d type %d", graph, op->type);
    }
}

static cudnnStatus_t finalize_graph(Desc* d) {
    Attr* ops = find(d, A_GRAPH_OPS);
    if (!ops || ops->count == 0) return error(BAD_PARAM, "fake cuDNN: an operation graph without operations");
    Desc** list = (Desc**)ops->bytes;
    for (int64_t i = 0; i < ops->count; ++i) {
        if (!list[i]->finalized) return error(BAD_PARAM, "fake cuDNN: an operation that is not finalized");
        if (mode_is("reject_int32_mask") && list[i]->type == T_OP_POINTWISE) {
            Desc* pw = desc_of(list[i], A_OP_PW, 0);
            if (int64_of(pw, A_PW_MODE, -1) == GEN_INDEX && int64_of(pw, A_PW_PREC, -1) == DATA_INT32)
                return error(NOT_SUPPORTED, "fake cuDNN: GEN_INDEX in int32 is not supported by this build");
        }
    }
    d->graph_id = ++graphs_made;
    say("graph %d ops %lld", d->graph_id, (long long)ops->count);
    for (int64_t i = 0; i < ops->count; ++i) log_op(d->graph_id, list[i]);
    log_tensors(d->graph_id, list, ops->count);
    return SUCCESS;
}

/* The graph a plan's configuration or engine belongs to. */
static Desc* graph_of_engine(Desc* engine) { return engine ? desc_of(engine, A_ENGINE_GRAPH, 0) : NULL; }

static cudnnStatus_t finalize_plan(Desc* d) {
    Desc* config = desc_of(d, A_PLAN_CONFIG, 0);
    if (!config || config->engine < 0) return error(BAD_PARAM, "fake cuDNN: a plan without an engine configuration");
    Desc* engine = desc_of(config, A_CFG_ENGINE, 0);
    Desc* graph = graph_of_engine(engine);
    d->engine = config->engine;
    d->graph_id = graph ? graph->graph_id : config->graph_id;
    if (mode_is("no_engine")) {
        say("plan %d engine %lld status %d", d->graph_id, (long long)d->engine, NOT_SUPPORTED);
        return error(NOT_SUPPORTED, "fake cuDNN: no engine supports this graph");
    }
    say("plan %d engine %lld status %d", d->graph_id, (long long)d->engine, SUCCESS);
    return SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(void* descriptor) {
    Desc* d = descriptor;
    cudnnStatus_t s = SUCCESS;
    switch (d->type) {
        case T_TENSOR:
            if (!find(d, A_TENSOR_DIMS) || !find(d, A_TENSOR_STRIDES) || !find(d, A_TENSOR_UID) || !find(d, A_TENSOR_DTYPE))
                s = error(BAD_PARAM, "fake cuDNN: a tensor needs dimensions, strides, a unique id and a data type");
            break;
        case T_OP_POINTWISE:
            if (!find(d, A_OP_PW) || !find(d, A_OP_PW_X) || !find(d, A_OP_PW_Y)) s = error(BAD_PARAM, "fake cuDNN: a pointwise operation needs x, y and its mode");
            break;
        case T_OP_MATMUL:
            if (!find(d, A_OP_MM_A) || !find(d, A_OP_MM_B) || !find(d, A_OP_MM_C) || !find(d, A_OP_MM_DESC))
                s = error(BAD_PARAM, "fake cuDNN: a matmul needs a, b, c and its descriptor");
            break;
        case T_GRAPH: s = finalize_graph(d); break;
        case T_ENGINE: {
            Desc* graph = desc_of(d, A_ENGINE_GRAPH, 0);
            d->engine = int64_of(d, A_ENGINE_INDEX, -1);
            if (!graph || d->engine < 0 || d->engine > 9) s = error(NOT_SUPPORTED, "fake cuDNN: no such engine for this graph");
            else d->graph_id = graph->graph_id;
            break;
        }
        case T_ENGINECFG: {
            Desc* engine = desc_of(d, A_CFG_ENGINE, 0);
            if (!engine) s = error(BAD_PARAM, "fake cuDNN: a configuration without an engine");
            else d->engine = engine->engine, d->graph_id = engine->graph_id;
            break;
        }
        case T_PLAN: s = finalize_plan(d); break;
        case T_VARIANT_PACK: say("pack 0"); break;
        default: break;
    }
    if (s == SUCCESS) d->finalized = 1;
    return s;
}

static int nondeterministic(int64_t engine) { return mode_is("nondeterministic_only") || engine == 7; }

/* Offered by the heuristics: engine 7, then engine 8. */
static void make_config(Desc* config, Desc* graph, int64_t engine) {
    config->engine = engine;
    config->graph_id = graph ? graph->graph_id : 0;
    config->finalized = 1;
}

cudnnStatus_t cudnnBackendGetAttribute(void* descriptor, int32_t name, int32_t type, int64_t requested, int64_t* count, void* values) {
    Desc* d = descriptor;
    (void)type;
    if (d->type == T_ENGINEHEUR && name == A_HEUR_RESULTS) {
        const int64_t offered = 2;
        *count = requested == 0 ? offered : (requested < offered ? requested : offered);
        Desc* graph = desc_of(d, 201, 0);
        for (int64_t i = 0; i < *count && requested > 0; ++i) make_config(((Desc**)values)[i], graph, 7 + i);
        return SUCCESS;
    }
    if (d->type == T_ENGINECFG && name == A_CFG_ENGINE) {
        Desc* engine = *(Desc**)values;
        engine->engine = d->engine;
        engine->graph_id = d->graph_id;
        engine->finalized = 1;
        *count = 1;
        return SUCCESS;
    }
    if (d->type == T_ENGINE && name == A_ENGINE_INDEX) {
        *(int64_t*)values = d->engine;
        *count = 1;
        return SUCCESS;
    }
    if (d->type == T_ENGINE && name == A_ENGINE_NUMERICAL) {
        int32_t* notes = values;
        int64_t n = 0;
        if (requested > n) notes[n++] = NOTE_TENSOR_CORE;
        if (nondeterministic(d->engine) && requested > n) notes[n++] = NOTE_NONDETERMINISTIC;
        *count = n;
        return SUCCESS;
    }
    if (d->type == T_ENGINE && name == A_ENGINE_BEHAVIOR) {
        int32_t* notes = values;
        *count = 0;
        if (requested > 0) notes[(*count)++] = BEHAVIOR_RUNTIME_COMPILATION;
        return SUCCESS;
    }
    if (d->type == T_PLAN && name == A_PLAN_WORKSPACE) {
        *(int64_t*)values = 1 << 20;
        *count = 1;
        return SUCCESS;
    }
    if (d->type == T_GRAPH && name == A_GRAPH_ENGINE_COUNT) {
        *(int64_t*)values = 10;
        *count = 1;
        return SUCCESS;
    }
    return error(BAD_PARAM, "fake cuDNN: attribute not modelled");
}

cudnnStatus_t cudnnBackendExecute(void* handle, void* plan, void* pack) {
    (void)handle;
    Desc* p = plan;
    Desc* v = pack;
    if (!p->finalized || !v->finalized) return error(BAD_PARAM, "fake cuDNN: execution of an unfinalized plan or variant pack");
    Attr* uids = find(v, A_PACK_UIDS);
    Attr* ptrs = find(v, A_PACK_POINTERS);
    if (!uids || !ptrs || uids->count != ptrs->count) return error(BAD_PARAM, "fake cuDNN: a variant pack needs as many pointers as unique ids");
    for (int64_t i = 0; i < uids->count; ++i) {
        int64_t uid;
        void* ptr;
        memcpy(&uid, uids->bytes + i * 8, sizeof uid);
        memcpy(&ptr, ptrs->bytes + i * (int64_t)sizeof(void*), sizeof ptr);
        /* Scalars travel by value: uids 6, 7 and 13 are the graphs' (scale, mask fill, one). */
        if (uid == 6 || uid == 7 || uid == 13) say("execute %d uid %lld ptr %p value %.9g", p->graph_id, (long long)uid, ptr, (double)*(float*)ptr);
        else say("execute %d uid %lld ptr %p", p->graph_id, (long long)uid, ptr);
    }
    return SUCCESS;
}
