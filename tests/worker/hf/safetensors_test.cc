#include "worker/hf/safetensors.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/test_env.h"
#include "tests/worker/test_files.h"
#include "worker/common/file_access.h"

namespace oomb {
namespace {

using ::testing::HasSubstr;

// Bits of small non-negative integers k (exact in every float type used here).
uint16_t HalfBits(int k) {
  if (k == 0) return 0;
  int e = 0;
  while ((2 << e) <= k) ++e;
  const int mantissa = (k - (1 << e)) * 1024 / (1 << e);
  return static_cast<uint16_t>(((e + 15) << 10) | mantissa);
}
uint16_t Bf16Bits(int k) {
  const float f = static_cast<float>(k);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

// A tensor whose elements are arange(numel) cast to `dtype` (bool: k % 2), owning its bytes.
struct OwnedTensor {
  TensorView view;
  std::vector<unsigned char> bytes;
};

OwnedTensor Arange(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  OwnedTensor t;
  const int64_t n = NumElements(shape);
  t.bytes.resize(static_cast<size_t>(n) * DTypeSize(dtype));
  for (int64_t k = 0; k < n; ++k) {
    unsigned char* p = t.bytes.data() + k * DTypeSize(dtype);
    const int ik = static_cast<int>(k);
    switch (dtype) {
      case DType::kF64: {
        const double v = ik;
        std::memcpy(p, &v, 8);
        break;
      }
      case DType::kF32: {
        const float v = static_cast<float>(ik);
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kF16: {
        const uint16_t v = HalfBits(ik);
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kBF16: {
        const uint16_t v = Bf16Bits(ik);
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kI64: {
        const int64_t v = ik;
        std::memcpy(p, &v, 8);
        break;
      }
      case DType::kI32: {
        const int32_t v = ik;
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kI16: {
        const int16_t v = static_cast<int16_t>(ik);
        std::memcpy(p, &v, 2);
        break;
      }
      case DType::kI8:
      case DType::kU8:
        *p = static_cast<unsigned char>(ik);
        break;
      case DType::kBool:
        *p = static_cast<unsigned char>(ik % 2);
        break;
    }
  }
  t.view = TensorView{name, dtype, std::move(shape), t.bytes.data(), t.bytes.size()};
  return t;
}

std::vector<OwnedTensor> SampleTensors() {
  std::vector<OwnedTensor> ts;
  ts.push_back(Arange("model.layers.0.mlp.up_proj.weight", DType::kF32, {3, 5}));
  ts.push_back(Arange("b.bf16", DType::kBF16, {7}));
  ts.push_back(Arange("c.f16", DType::kF16, {2, 3}));
  ts.push_back(Arange("d.f64", DType::kF64, {3}));
  ts.push_back(Arange("e.i64", DType::kI64, {2, 2}));
  ts.push_back(Arange("f.i32", DType::kI32, {5}));
  ts.push_back(Arange("g.i16", DType::kI16, {3}));
  ts.push_back(Arange("h.i8", DType::kI8, {9}));
  ts.push_back(Arange("i.u8", DType::kU8, {4}));
  ts.push_back(Arange("j.bool", DType::kBool, {6}));
  ts.push_back(Arange("k.scalar", DType::kF32, {}));
  ts.push_back(Arange("l.empty", DType::kF32, {0, 4}));
  ts.push_back(Arange("a.f32", DType::kF32, {1}));
  return ts;
}

std::vector<TensorView> Views(const std::vector<OwnedTensor>& ts) {
  std::vector<TensorView> v;
  for (const auto& t : ts) v.push_back(t.view);
  return v;
}

// SafetensorsFile::Open of the file at `path`.
absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenSafetensors(const std::string& path) {
  absl::StatusOr<File> file = testing::OpenFile(path);
  if (!file.ok()) return file.status();
  return SafetensorsFile::Open(*file);
}

std::string ReadAll(const std::string& path) {
  auto s = FileAccess::Unconfined()->ReadFile(path);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : "";
}

// Writes [u64 len][header][data] as given, for malformed-input tests.
std::string WriteRaw(const std::string& dir, const std::string& name, const std::string& header,
                     const std::string& data, int64_t header_len_override = -1) {
  const std::string path = dir + "/" + name;
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header_len_override >= 0 ? static_cast<uint64_t>(header_len_override) : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << data;
  return path;
}

TEST(DTypeTest, NamesSizesAndParsing) {
  EXPECT_EQ(DTypeName(DType::kBF16), "BF16");
  EXPECT_EQ(DTypeName(DType::kBool), "BOOL");
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  for (DType d : {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kI32, DType::kI16,
                  DType::kI8, DType::kU8, DType::kBool}) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(ParseDType("F8_E4M3").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseDType("f32").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, RoundTrip) {
  const std::string dir = testing::ScratchDir("st_roundtrip");
  const auto ts = SampleTensors();
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "héllo \"quoted\"\n"}};
  ASSERT_TRUE(WriteSafetensors(testing::OpenDir(dir), "a.safetensors", Views(ts), meta).ok());
  auto f = OpenSafetensors(dir + "/a.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->metadata(), meta);
  ASSERT_EQ((*f)->tensors().size(), ts.size());
  for (const auto& t : ts) {
    const TensorView* v = (*f)->Find(t.view.name);
    ASSERT_NE(v, nullptr) << t.view.name;
    EXPECT_EQ(v->dtype, t.view.dtype);
    EXPECT_EQ(v->shape, t.view.shape);
    ASSERT_EQ(v->nbytes, t.bytes.size());
    EXPECT_EQ(std::memcmp(v->data, t.bytes.data(), v->nbytes), 0) << t.view.name;
  }
  EXPECT_EQ((*f)->Find("nope"), nullptr);
  // The data section starts 8-byte aligned.
  const std::string raw = ReadAll(dir + "/a.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(raw.substr(8, 16), "{\"__metadata__\":");
  // No temporary file is left behind.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  const std::string dir = testing::ScratchDir("st_writer_bad");
  auto a = Arange("x", DType::kF32, {2});
  auto dup = a;
  EXPECT_EQ(WriteSafetensors(testing::OpenDir(dir), "d.safetensors", {a.view, dup.view}, {}).code(),
            absl::StatusCode::kInvalidArgument);
  auto wrong = a;
  wrong.view.shape = {3};
  EXPECT_EQ(WriteSafetensors(testing::OpenDir(dir), "w.safetensors", {wrong.view}, {}).code(),
            absl::StatusCode::kInvalidArgument);
  auto meta = a;
  meta.view.name = "__metadata__";
  EXPECT_EQ(WriteSafetensors(testing::OpenDir(dir), "m.safetensors", {meta.view}, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafetensors(testing::OpenDir(dir), "../x.safetensors", {a.view}, {}).code(),
            absl::StatusCode::kInvalidArgument);  // a plain file name in the directory
}

// Our writer and the Python package produce identical bytes, and each reads the other's file.
// One metadata key: the Python package writes several in hash-map order, which varies from run
// to run, so byte equality is only defined for one.
TEST(SafetensorsTest, InteroperatesWithPythonSafetensors) {
  const std::string py = testing::VenvPython();
  if (py.empty()) GTEST_SKIP() << "Python venv not found (set OOMB_VENV or run the setup script)";
  const std::string dir = testing::ScratchDir("st_python");
  const auto ts = SampleTensors();
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  ASSERT_TRUE(WriteSafetensors(testing::OpenDir(dir), "ours.safetensors", Views(ts), meta).ok());
  const std::string cmd = py + " " + testing::SourceDir() + "/tests/python/safetensors_roundtrip.py " + dir +
                          "/ours.safetensors " + dir + "/theirs.safetensors";
  ASSERT_EQ(testing::RunCommand(cmd), 0) << cmd;
  EXPECT_EQ(ReadAll(dir + "/ours.safetensors"), ReadAll(dir + "/theirs.safetensors"));
  auto f = OpenSafetensors(dir + "/theirs.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->tensors().size(), ts.size());
  EXPECT_EQ((*f)->metadata(), meta);
}

TEST(WeightSetTest, OpensSingleFileModel) {
  const std::string dir = testing::DataDir() + "/models/SmolLM2-135M-Instruct";
  if (!std::filesystem::exists(dir))
    GTEST_SKIP() << "test data not found at " << dir << " (scripts/fetch_test_data.sh)";
  auto ws = WeightSet::Open(testing::OpenDir(dir));
  ASSERT_TRUE(ws.ok()) << ws.status();
  const TensorView* emb = (*ws)->Find("model.embed_tokens.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(emb->nbytes, size_t{49152} * 576 * DTypeSize(emb->dtype));
}

TEST(WeightSetTest, OpensShardedModel) {
  const std::string dir = testing::DataDir() + "/tiny/llama-sharded";
  if (!std::filesystem::exists(dir))
    GTEST_SKIP() << "test data not found at " << dir << " (scripts/fetch_test_data.sh)";
  auto ws = WeightSet::Open(testing::OpenDir(dir));
  ASSERT_TRUE(ws.ok()) << ws.status();
  EXPECT_EQ((*ws)->files().size(), 5u);
  ASSERT_NE((*ws)->Find("lm_head.weight"), nullptr);
  ASSERT_NE((*ws)->Find("model.layers.0.self_attn.q_proj.weight"), nullptr);
  EXPECT_EQ((*ws)->Find("model.layers.0.self_attn.q_proj.weight")->dtype, DType::kF32);
  const auto names = (*ws)->names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  // An explicit file name opens just that file.
  auto one = WeightSet::Open(testing::OpenDir(dir), "model-00005-of-00005.safetensors");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_NE((*one)->Find("lm_head.weight"), nullptr);
  EXPECT_EQ((*one)->Find("model.embed_tokens.weight"), nullptr);
}

TEST(WeightSetTest, OpensAdapterByFileName) {
  const std::string dir = testing::ScratchDir("ws_adapter");
  auto a = Arange("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", DType::kF32, {4, 8});
  ASSERT_TRUE(WriteSafetensors(testing::OpenDir(dir), "adapter_model.safetensors", {a.view}, {}).ok());
  EXPECT_EQ(WeightSet::Open(testing::OpenDir(dir)).status().code(), absl::StatusCode::kNotFound);
  auto ws = WeightSet::Open(testing::OpenDir(dir), "adapter_model.safetensors");
  ASSERT_TRUE(ws.ok()) << ws.status();
  EXPECT_EQ((*ws)->names().size(), 1u);
}

// ---- malformed files: the right code, a message naming file and tensor, never a crash ----

void ExpectInvalid(const std::string& path, const std::vector<std::string>& fragments,
                   absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
  auto f = OpenSafetensors(path);
  ASSERT_FALSE(f.ok()) << path;
  EXPECT_EQ(f.status().code(), code) << f.status();
  EXPECT_THAT(std::string(f.status().message()), HasSubstr(std::filesystem::path(path).filename().string()));
  for (const auto& frag : fragments) EXPECT_THAT(std::string(f.status().message()), HasSubstr(frag));
}

TEST(SafetensorsBadInputTest, EveryMalformedFileIsRejected) {
  const std::string dir = testing::ScratchDir("st_bad");
  const std::string t = R"("model.layers.0.mlp.up_proj.weight")";
  ExpectInvalid(dir + "/missing.safetensors", {"No such file"}, absl::StatusCode::kNotFound);
  {
    std::ofstream(dir + "/short.safetensors") << "abc";
    ExpectInvalid(dir + "/short.safetensors", {"fewer than the 8-byte"});
  }
  ExpectInvalid(WriteRaw(dir, "hdrlen.safetensors", "{}", "", 1000), {"exceeds the file size"});
  ExpectInvalid(WriteRaw(dir, "huge.safetensors", "{}", "", int64_t{1} << 40), {"exceeds the limit"});
  ExpectInvalid(WriteRaw(dir, "badjson.safetensors", "{\"a\": [1, 2", ""), {"not valid JSON"});
  ExpectInvalid(WriteRaw(dir, "array.safetensors", "[1, 2]", ""), {"not a JSON object"});
  ExpectInvalid(WriteRaw(dir, "dtype.safetensors",
                         "{" + t + R"(:{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", std::string(2, '\0')),
                {"model.layers.0.mlp.up_proj.weight", "unknown dtype 'F8_E4M3'"});
  ExpectInvalid(WriteRaw(dir, "size.safetensors", "{" + t + R"(:{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})",
                         std::string(24, '\0')),
                {"model.layers.0.mlp.up_proj.weight", "needs 24 bytes", "span 20"});
  ExpectInvalid(WriteRaw(dir, "negshape.safetensors",
                         "{" + t + R"(:{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0')),
                {"model.layers.0.mlp.up_proj.weight", "shape"});
  ExpectInvalid(WriteRaw(dir, "bounds.safetensors", "{" + t + R"(:{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                         std::string(8, '\0')),
                {"tensor 'model.layers.0.mlp.up_proj.weight': data_offsets [0,16] exceed the data section of 8 bytes",
                 "truncated"});
  ExpectInvalid(WriteRaw(dir, "reversed.safetensors", "{" + t + R"(:{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})",
                         std::string(8, '\0')),
                {"model.layers.0.mlp.up_proj.weight", "begin > end"});
  ExpectInvalid(WriteRaw(dir, "overlap.safetensors",
                         R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         std::string(12, '\0')),
                {"tensor 'b'", "overlap", "tensor 'a'"});
  ExpectInvalid(WriteRaw(dir, "dupkey.safetensors",
                         R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         std::string(8, '\0')),
                {"duplicate key 'a'"});
  ExpectInvalid(WriteRaw(dir, "offsets.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})",
                         std::string(4, '\0')),
                {"tensor 'a'", "data_offsets"});
  ExpectInvalid(WriteRaw(dir, "meta.safetensors", R"({"__metadata__":{"k":1}})", ""), {"__metadata__"});
  ExpectInvalid(
      WriteRaw(dir, "nodtype.safetensors", R"({"a":{"shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')),
      {"tensor 'a'", "dtype"});
  ExpectInvalid(WriteRaw(dir, "overflow.safetensors",
                         R"({"a":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})",
                         std::string(8, '\0')),
                {"tensor 'a'", "overflows"});
}

// A real file cut short: the last tensor's range runs past the end.
TEST(SafetensorsBadInputTest, TruncatedRealFile) {
  const std::string dir = testing::ScratchDir("st_trunc");
  const auto ts = SampleTensors();
  ASSERT_TRUE(WriteSafetensors(testing::OpenDir(dir), "full.safetensors", Views(ts), {}).ok());
  const std::string raw = ReadAll(dir + "/full.safetensors");
  for (size_t cut : {size_t{3}, size_t{8}, size_t{20}, raw.size() - 1}) {
    const std::string path = dir + "/cut" + std::to_string(cut) + ".safetensors";
    std::ofstream(path, std::ios::binary) << raw.substr(0, cut);
    auto f = OpenSafetensors(path);
    ASSERT_FALSE(f.ok()) << cut;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
    EXPECT_THAT(std::string(f.status().message()), HasSubstr("cut" + std::to_string(cut)));
  }
}

// Sharded checkpoints: copy the tiny sharded model and break its index in each way.
class ShardedBadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = testing::DataDir() + "/tiny/llama-sharded";
    if (!std::filesystem::exists(src_)) GTEST_SKIP() << "test data not found at " << src_;
    dir_ = testing::ScratchDir("ws_bad");
    std::filesystem::copy(src_, dir_, std::filesystem::copy_options::recursive);
  }
  void WriteIndex(const std::string& text) {
    ASSERT_TRUE(FileAccess::Unconfined()->OpenDir(dir_)->WriteFileAtomic("model.safetensors.index.json", text).ok());
  }
  std::string src_, dir_;
};

TEST_F(ShardedBadInputTest, MissingShard) {
  std::filesystem::remove(dir_ + "/model-00003-of-00005.safetensors");
  auto ws = WeightSet::Open(testing::OpenDir(dir_));
  ASSERT_FALSE(ws.ok());
  EXPECT_EQ(ws.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(ws.status().message()), HasSubstr("model-00003-of-00005.safetensors"));
  EXPECT_THAT(std::string(ws.status().message()), HasSubstr("model.layers.1."));
  EXPECT_THAT(std::string(ws.status().message()), HasSubstr("model.safetensors.index.json"));
}

TEST_F(ShardedBadInputTest, TensorInTwoShards) {
  // Shard 6 holds lm_head.weight again.
  auto shard5 = OpenSafetensors(dir_ + "/model-00005-of-00005.safetensors");
  ASSERT_TRUE(shard5.ok());
  ASSERT_TRUE(WriteSafetensors(testing::OpenDir(dir_), "extra.safetensors", (*shard5)->tensors(), {}).ok());
  auto index = FileAccess::Unconfined()->ReadFile(dir_ + "/model.safetensors.index.json");
  ASSERT_TRUE(index.ok());
  std::string text = *index;
  const std::string key = "\"weight_map\": {";
  const size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos);
  text.insert(at + key.size(), "\n    \"zzz.extra\": \"extra.safetensors\",");
  WriteIndex(text);
  // extra.safetensors lacks zzz.extra: first the mapping error...
  auto ws = WeightSet::Open(testing::OpenDir(dir_));
  ASSERT_FALSE(ws.ok());
  EXPECT_THAT(std::string(ws.status().message()), HasSubstr("'zzz.extra'"));
  // ...and once it has it, the duplicate lm_head.weight.
  auto lm = (*shard5)->tensors();
  auto extra = Arange("zzz.extra", DType::kF32, {1});
  lm.push_back(extra.view);
  ASSERT_TRUE(WriteSafetensors(testing::OpenDir(dir_), "extra.safetensors", lm, {}).ok());
  ws = WeightSet::Open(testing::OpenDir(dir_));
  ASSERT_FALSE(ws.ok());
  EXPECT_EQ(ws.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ws.status().message()), HasSubstr("'lm_head.weight' appears in two shards"));
  EXPECT_THAT(std::string(ws.status().message()), HasSubstr("extra.safetensors"));
}

TEST_F(ShardedBadInputTest, DuplicateKeyInIndex) {
  WriteIndex(R"({"weight_map": {"lm_head.weight": "model-00005-of-00005.safetensors",
                                "lm_head.weight": "model-00001-of-00005.safetensors"}})");
  auto ws = WeightSet::Open(testing::OpenDir(dir_));
  ASSERT_FALSE(ws.ok());
  EXPECT_EQ(ws.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ws.status().message()), HasSubstr("duplicate key 'lm_head.weight'"));
}

TEST_F(ShardedBadInputTest, TensorNotInItsShard) {
  WriteIndex(R"({"weight_map": {"lm_head.weight": "model-00001-of-00005.safetensors"}})");
  auto ws = WeightSet::Open(testing::OpenDir(dir_));
  ASSERT_FALSE(ws.ok());
  EXPECT_EQ(ws.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ws.status().message()), HasSubstr("'lm_head.weight'"));
  EXPECT_THAT(std::string(ws.status().message()), HasSubstr("does not contain it"));
}

TEST_F(ShardedBadInputTest, MalformedIndex) {
  WriteIndex("{not json");
  EXPECT_EQ(WeightSet::Open(testing::OpenDir(dir_)).status().code(), absl::StatusCode::kInvalidArgument);
  WriteIndex(R"({"weight_map": {"a": "../etc/passwd"}})");
  EXPECT_EQ(WeightSet::Open(testing::OpenDir(dir_)).status().code(), absl::StatusCode::kInvalidArgument);
  WriteIndex(R"({"metadata": {}})");
  EXPECT_EQ(WeightSet::Open(testing::OpenDir(dir_)).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace oomb
