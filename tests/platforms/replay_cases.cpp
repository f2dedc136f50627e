// replay_cases: runs the cases tests/platforms/record_cases.py recorded (a model, its feeds, the outputs one build of
// the library gave) through onnxruntime's C API with a library given here, and compares every output bit for bit.
// onnxruntime is loaded with dlopen, so one binary serves any libonnxruntime.so (API version 21 or newer), such as
// the one in onnxruntime's Python wheel; scripts/test-old-glibc runs it on other systems and under qemu-user.
//
//   replay_cases LIBONNXRUNTIME LIBORT_RMSNORM CASES_DIR [--expected DIR] [--save DIR] [--max-elements N]
//
// --expected DIR  compare with the outputs in DIR (laid out as CASES_DIR's data/) instead of the recorded ones
// --save DIR      write the outputs to DIR (as CASES_DIR's data/); without --expected, nothing is compared
// --max-elements N  skip cases with an input of more than N elements (they are counted and reported)
// Exit status 0 when every replayed output matched, 1 otherwise, 2 on bad usage or unreadable cases.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Tensor {
  std::string name, file;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> shape;
  std::vector<char> data;
  int64_t elements = 1;
};

struct Case {
  int64_t index = 0;
  std::string model;
  int threads = 0;
  std::string test;
  std::vector<Tensor> inputs, outputs;
};

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "replay_cases: %s\n", message.c_str());
  std::exit(2);
}

std::vector<char> ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) Die("cannot read " + path);
  return std::vector<char>(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

size_t ElementSize(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return 2;
    default: Die("unsupported element type " + std::to_string(type));
  }
}

void WriteFile(const std::string& path, const char* data, size_t size) {
  std::ofstream file(path, std::ios::binary);
  if (!file.write(data, static_cast<std::streamsize>(size))) Die("cannot write " + path);
}

// Inputs come from `dir`; expected outputs from `expected` (none when empty).
std::vector<Case> ReadCases(const std::string& dir, const std::string& expected) {
  std::ifstream listing(dir + "/cases.txt");
  if (!listing) Die("cannot read " + dir + "/cases.txt");
  std::vector<Case> cases;
  std::string line;
  while (std::getline(listing, line)) {
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    if (kind == "case") {
      Case c;
      fields >> c.index >> c.model >> c.threads >> c.test;
      cases.push_back(std::move(c));
    } else if (kind == "in" || kind == "out") {
      if (cases.empty()) Die("a tensor before the first case in cases.txt");
      Tensor t;
      int type = 0, rank = 0;
      fields >> t.name >> type >> rank;
      t.type = static_cast<ONNXTensorElementDataType>(type);
      for (int i = 0; i < rank; ++i) {
        int64_t dim = 0;
        fields >> dim;
        t.shape.push_back(dim);
        t.elements *= dim;
      }
      fields >> t.file;
      if (!fields) Die("malformed line in cases.txt: " + line);
      if (kind == "in" || !expected.empty()) {
        t.data = ReadFile((kind == "in" ? dir : expected) + "/" + t.file);
        if (t.data.size() != static_cast<size_t>(t.elements) * ElementSize(t.type)) Die("wrong size: " + t.file);
      }
      (kind == "in" ? cases.back().inputs : cases.back().outputs).push_back(std::move(t));
    } else if (!kind.empty()) {
      Die("malformed line in cases.txt: " + line);
    }
  }
  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    Die("usage: replay_cases LIBONNXRUNTIME LIBORT_RMSNORM CASES_DIR [--expected DIR] [--save DIR] "
        "[--max-elements N]");
  }
  const std::string ort_path = argv[1], library = argv[2], dir = argv[3];
  int64_t max_elements = -1;
  std::string expected_dir, save_dir;
  for (int i = 4; i < argc; ++i) {
    if (std::strcmp(argv[i], "--max-elements") == 0 && i + 1 < argc) {
      max_elements = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--expected") == 0 && i + 1 < argc) {
      expected_dir = argv[++i];
    } else if (std::strcmp(argv[i], "--save") == 0 && i + 1 < argc) {
      save_dir = argv[++i];
    } else {
      Die(std::string("unknown argument ") + argv[i]);
    }
  }
  void* ort = dlopen(ort_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (ort == nullptr) Die(std::string("dlopen: ") + dlerror());
  using GetApiBase = const OrtApiBase* (*)();
  auto get_api_base = reinterpret_cast<GetApiBase>(dlsym(ort, "OrtGetApiBase"));
  if (get_api_base == nullptr) Die(ort_path + " has no OrtGetApiBase");
  const OrtApi* api = get_api_base()->GetApi(ORT_API_VERSION);
  if (api == nullptr) Die(std::string("onnxruntime ") + get_api_base()->GetVersionString() + " lacks API version " +
                          std::to_string(ORT_API_VERSION));
  Ort::InitApi(api);

  const bool compare = save_dir.empty() || !expected_dir.empty();
  if (compare && expected_dir.empty()) expected_dir = dir;
  const std::vector<Case> cases = ReadCases(dir, compare ? expected_dir : std::string());
  const char* isa = std::getenv("ORT_RMSNORM_CPU_ISA");
  std::printf("replay_cases: onnxruntime %s, %zu cases, library %s (ORT_RMSNORM_CPU_ISA=%s)\n",
              get_api_base()->GetVersionString(), cases.size(), library.c_str(), isa ? isa : "");
  std::fflush(stdout);

  Ort::Env env(ORT_LOGGING_LEVEL_ERROR, "replay_cases");
  Ort::MemoryInfo memory = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::unique_ptr<Ort::Session> session;
  std::string session_key;
  int64_t replayed = 0, skipped = 0, outputs = 0, differing = 0, failed = 0;
  for (const Case& c : cases) {
    bool too_large = false;
    for (const Tensor& t : c.inputs) too_large |= max_elements >= 0 && t.elements > max_elements;
    if (too_large) {
      ++skipped;
      continue;
    }
    try {
      const std::string key = c.model + "/" + std::to_string(c.threads);
      if (key != session_key) {
        session.reset();
        Ort::SessionOptions options;
        options.SetGraphOptimizationLevel(ORT_ENABLE_ALL);
        if (c.threads > 0) options.SetIntraOpNumThreads(c.threads);
        options.RegisterCustomOpsLibrary(library.c_str());
        const std::vector<char> model = ReadFile(dir + "/" + c.model);
        session = std::make_unique<Ort::Session>(env, model.data(), model.size(), options);
        session_key = key;
      }
      std::vector<Ort::Value> feeds;
      std::vector<const char*> input_names, output_names;
      for (const Tensor& t : c.inputs) {
        // onnxruntime reads the feeds only; the C API takes a non-const pointer.
        feeds.push_back(Ort::Value::CreateTensor(memory, const_cast<char*>(t.data.data()), t.data.size(),
                                                 t.shape.data(), t.shape.size(), t.type));
        input_names.push_back(t.name.c_str());
      }
      for (const Tensor& t : c.outputs) output_names.push_back(t.name.c_str());
      std::vector<Ort::Value> results = session->Run(Ort::RunOptions{nullptr}, input_names.data(), feeds.data(),
                                                     feeds.size(), output_names.data(), output_names.size());
      for (size_t i = 0; i < results.size(); ++i) {
        const Tensor& expected = c.outputs[i];
        auto info = results[i].GetTensorTypeAndShapeInfo();
        const size_t bytes = info.GetElementCount() * ElementSize(info.GetElementType());
        const char* data = bytes ? static_cast<const char*>(results[i].GetTensorRawData()) : nullptr;
        ++outputs;
        if (!save_dir.empty()) WriteFile(save_dir + "/" + expected.file, data, bytes);
        if (!compare) continue;
        if (info.GetElementType() != expected.type || info.GetShape() != expected.shape ||
            bytes != expected.data.size() || (bytes && std::memcmp(data, expected.data.data(), bytes) != 0)) {
          size_t first = 0;
          const size_t size = ElementSize(expected.type);
          while (bytes == expected.data.size() && first + size <= bytes &&
                 std::memcmp(data + first, expected.data.data() + first, size) == 0) first += size;
          if (++differing <= 20)
            std::printf("DIFFERS: case %lld output %s (%s): first at element %zu\n",
                        static_cast<long long>(c.index), expected.name.c_str(), c.test.c_str(), first / size);
        }
      }
      ++replayed;
    } catch (const Ort::Exception& e) {
      if (++failed <= 20)
        std::printf("FAILED: case %lld (%s): %s\n", static_cast<long long>(c.index), c.test.c_str(), e.what());
      session.reset();
      session_key.clear();
    }
  }
  std::printf("replay_cases: %lld cases replayed (%lld skipped as larger than --max-elements), %lld outputs: "
              "%lld differ, %lld cases failed\n", static_cast<long long>(replayed), static_cast<long long>(skipped),
              static_cast<long long>(outputs), static_cast<long long>(differing), static_cast<long long>(failed));
  return differing == 0 && failed == 0 && replayed > 0 ? 0 : 1;
}
