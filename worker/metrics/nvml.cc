#include "worker/metrics/nvml.h"

#include <dlfcn.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace oomb {
namespace {

// The subset of nvml.h used here, with NVML's ABI (layouts checked against the header of
// driver R550+; nvmlFieldValue_t is 40 bytes there).
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr int kP2PCapsIndexNvlink = 2;       // NVML_P2P_CAPS_INDEX_NVLINK
constexpr int kP2PStatusOk = 0;              // NVML_P2P_STATUS_OK
constexpr unsigned kFieldPcieTxBytes = 197;  // NVML_FI_DEV_PCIE_COUNT_TX_BYTES
constexpr unsigned kFieldPcieRxBytes = 198;  // NVML_FI_DEV_PCIE_COUNT_RX_BYTES
constexpr int kValueTypeUnsignedInt = 1;     // NVML_VALUE_TYPE_UNSIGNED_INT
constexpr int kValueTypeUnsignedLong = 2;
constexpr int kValueTypeUnsignedLongLong = 3;
constexpr int kValueTypeSignedLongLong = 4;

struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

union nvmlValue_t {
  double dVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  long long sllVal;
  int siVal;
  unsigned short usVal;
};

struct nvmlFieldValue_t {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;
  long long latencyUsec;
  int valueType;
  nvmlReturn_t nvmlReturn;
  nvmlValue_t value;
};
static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t must match nvml.h");

}  // namespace

struct Nvml::Api {
  nvmlReturn_t (*init)();
  nvmlReturn_t (*shutdown)();
  nvmlReturn_t (*device_count)(unsigned*);
  nvmlReturn_t (*handle_by_index)(unsigned, nvmlDevice_t*);
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned);
  nvmlReturn_t (*memory_info)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*field_values)(nvmlDevice_t, int, nvmlFieldValue_t*);
  nvmlReturn_t (*max_link_generation)(nvmlDevice_t, unsigned*);
  nvmlReturn_t (*max_link_width)(nvmlDevice_t, unsigned*);
  nvmlReturn_t (*handle_by_uuid)(const char*, nvmlDevice_t*);
  nvmlReturn_t (*p2p_status)(nvmlDevice_t, nvmlDevice_t, int, int*);
};

absl::StatusOr<std::unique_ptr<Nvml>> Nvml::Open() {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return absl::UnavailableError(absl::StrCat("NVML: ", ::dlerror()));
  auto api = std::make_unique<Api>();
  std::string missing;
  auto bind = [&](auto* fn, const char* name) {
    void* sym = ::dlsym(lib, name);
    if (sym == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(sym);
  };
  bind(&api->init, "nvmlInit_v2");
  bind(&api->shutdown, "nvmlShutdown");
  bind(&api->device_count, "nvmlDeviceGetCount_v2");
  bind(&api->handle_by_index, "nvmlDeviceGetHandleByIndex_v2");
  bind(&api->uuid, "nvmlDeviceGetUUID");
  bind(&api->memory_info, "nvmlDeviceGetMemoryInfo");
  bind(&api->field_values, "nvmlDeviceGetFieldValues");
  bind(&api->max_link_generation, "nvmlDeviceGetMaxPcieLinkGeneration");
  bind(&api->max_link_width, "nvmlDeviceGetMaxPcieLinkWidth");
  bind(&api->handle_by_uuid, "nvmlDeviceGetHandleByUUID");
  bind(&api->p2p_status, "nvmlDeviceGetP2PStatus");
  if (!missing.empty()) {
    ::dlclose(lib);
    return absl::UnavailableError(absl::StrCat("NVML: libnvidia-ml.so.1 lacks ", missing));
  }
  if (const nvmlReturn_t r = api->init(); r != NVML_SUCCESS) {
    ::dlclose(lib);
    return absl::UnavailableError(absl::StrCat("NVML: nvmlInit_v2 returned ", r));
  }
  return std::unique_ptr<Nvml>(new Nvml(lib, std::move(api)));
}

Nvml::Nvml(void* library, std::unique_ptr<Api> api) : library_(library), api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  ::dlclose(library_);
}

absl::StatusOr<bool> Nvml::NvLinked(const std::string& uuid_a, const std::string& uuid_b) {
  nvmlDevice_t a = nullptr, b = nullptr;
  if (api_->handle_by_uuid(uuid_a.c_str(), &a) != NVML_SUCCESS ||
      api_->handle_by_uuid(uuid_b.c_str(), &b) != NVML_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("NVML: no device ", uuid_a, " or ", uuid_b));
  }
  int status = -1;
  if (const nvmlReturn_t r = api_->p2p_status(a, b, kP2PCapsIndexNvlink, &status); r != NVML_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("NVML: nvmlDeviceGetP2PStatus returned ", r));
  }
  return status == kP2PStatusOk;
}

uint64_t Nvml::Extend(Extended* c, uint64_t raw, uint64_t modulus) {
  if (c->seen && raw < c->last_raw) {
    // A 32-bit counter wrapped; a 64-bit one was reset (driver reload): count on from where
    // it was, so the exported counter never goes back.
    c->offset += modulus != 0 ? modulus : c->last_raw;
  }
  c->seen = true;
  c->last_raw = raw;
  return c->offset + raw;
}

std::vector<NvmlDeviceSample> Nvml::Sample() {
  std::vector<NvmlDeviceSample> out;
  unsigned count = 0;
  if (api_->device_count(&count) != NVML_SUCCESS) return out;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    if (api_->handle_by_index(i, &dev) != NVML_SUCCESS) continue;
    NvmlDeviceSample s;
    s.index = static_cast<int>(i);
    char uuid[96] = {};
    if (api_->uuid(dev, uuid, sizeof uuid) != NVML_SUCCESS) continue;
    s.uuid = uuid;
    nvmlMemory_t mem{};
    if (api_->memory_info(dev, &mem) == NVML_SUCCESS) {
      s.memory_used_bytes = static_cast<int64_t>(mem.used);
      s.memory_total_bytes = static_cast<int64_t>(mem.total);
    }
    unsigned gen = 0, width = 0;
    if (api_->max_link_generation(dev, &gen) == NVML_SUCCESS && api_->max_link_width(dev, &width) == NVML_SUCCESS) {
      s.pcie_link_bytes_per_second = PcieLinkBytesPerSecond(gen, width);
    }
    nvmlFieldValue_t fields[2];
    std::memset(fields, 0, sizeof fields);
    fields[0].fieldId = kFieldPcieTxBytes;
    fields[1].fieldId = kFieldPcieRxBytes;
    if (api_->field_values(dev, 2, fields) == NVML_SUCCESS) {
      absl::MutexLock lock(&mu_);
      for (const nvmlFieldValue_t& f : fields) {
        if (f.nvmlReturn != NVML_SUCCESS) continue;
        uint64_t raw = 0, modulus = 0;
        switch (f.valueType) {
          case kValueTypeUnsignedInt:
            raw = f.value.uiVal;
            modulus = uint64_t{1} << 32;
            break;
          case kValueTypeUnsignedLong:
            raw = f.value.ulVal;
            break;
          case kValueTypeUnsignedLongLong:
            raw = f.value.ullVal;
            break;
          case kValueTypeSignedLongLong:
            raw = static_cast<uint64_t>(f.value.sllVal);
            break;
          default:
            continue;  // not a byte count
        }
        const int64_t v = static_cast<int64_t>(Extend(&counters_[{s.uuid, static_cast<int>(f.fieldId)}], raw, modulus));
        (f.fieldId == kFieldPcieTxBytes ? s.pcie_tx_bytes : s.pcie_rx_bytes) = v;
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

int64_t PcieLinkBytesPerSecond(unsigned generation, unsigned width) {
  // Per lane and direction: transfer rate (GT/s) times the encoding's payload fraction, / 8.
  double lane = 0;
  switch (generation) {
    case 1:
      lane = 2.5e9 * 8 / 10 / 8;
      break;
    case 2:
      lane = 5e9 * 8 / 10 / 8;
      break;
    case 3:
      lane = 8e9 * 128 / 130 / 8;
      break;
    case 4:
      lane = 16e9 * 128 / 130 / 8;
      break;
    case 5:
      lane = 32e9 * 128 / 130 / 8;
      break;
    case 6:
      lane = 64e9 / 8;  // PAM4 with FLIT mode: no line encoding (FEC and CRC live in the flit)
      break;
    default:
      return -1;
  }
  if (width == 0) return -1;
  return static_cast<int64_t>(lane * width);
}

}  // namespace oomb
