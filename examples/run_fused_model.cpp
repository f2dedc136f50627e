// run_fused_model: runs an ONNX model that uses the ort_rmsnorm custom operators (RMSNorm, SkipRMSNorm) with the
// onnxruntime C++ API, the way a C++ application on an edge device would.
//
//   run_fused_model MODEL.onnx LIBRARY.so [options]
//
//   --dim NAME=N        size of the symbolic input dimension NAME (unset and unnamed free dimensions are 1)
//   --input NAME=FILE   raw data for an input (its element type, little-endian, row-major) instead of generated data
//   --seed N            seed of the generated inputs: normal(0.3, 1) values rounded to the input's type (default 1)
//   --threads N         onnxruntime intra-op threads (default: onnxruntime's choice)
//   --output-dir DIR    also write each output to DIR/<name>.bin (raw, like --input)
//   --check SPEC        compare with a float64 reference computed here. For a model that is one RMSNorm node fed by
//                       the graph inputs (X[, scale]) or one SkipRMSNorm node (X, skip[, scale]); SPEC gives the
//                       node's op and attributes: op=RMSNorm|SkipRMSNorm,axis=A,epsilon=E,eps_outside_sqrt=0|1
//
// Exit status: 0 ran (and the check passed), 1 the check failed, 2 bad usage or an onnxruntime error.
#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Shape = std::vector<int64_t>;

std::string ShapeText(const Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// A tensor of one of the ops' element types, held as bytes.
struct Tensor {
  std::string name;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  Shape shape;
  std::vector<uint8_t> bytes;

  size_t ElementSize() const { return type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ? 4 : 2; }
  size_t Count() const { return bytes.size() / ElementSize(); }

  uint16_t Bits16(size_t i) const {
    uint16_t bits;
    std::memcpy(&bits, bytes.data() + 2 * i, 2);
    return bits;
  }
  float At(size_t i) const {
    switch (type) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: {
        float v;
        std::memcpy(&v, bytes.data() + 4 * i, 4);
        return v;
      }
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return Ort::Float16_t::FromBits(Bits16(i)).ToFloat();
      default: return Ort::BFloat16_t::FromBits(Bits16(i)).ToFloat();
    }
  }
  // Stores v rounded to the element type (nearest-even).
  void Set(size_t i, float v) {
    uint16_t bits;
    switch (type) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: std::memcpy(bytes.data() + 4 * i, &v, 4); return;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: bits = Ort::Float16_t(v).val; break;
      default: bits = Ort::BFloat16_t(v).val; break;
    }
    std::memcpy(bytes.data() + 2 * i, &bits, 2);
  }
  // The element type's rounding of v, as a float.
  float Rounded(float v) const {
    Tensor one{name, type, {1}, std::vector<uint8_t>(ElementSize())};
    one.Set(0, v);
    return one.At(0);
  }
};

const char* TypeName(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    default: return nullptr;  // not a type of the ops
  }
}

struct Options {
  std::string model, library;
  std::map<std::string, int64_t> dims;
  std::map<std::string, std::string> input_files;
  unsigned seed = 1;
  int threads = 0;
  std::string output_dir;
  std::map<std::string, std::string> check;  // empty: no check
};

// "a=1,b=2" or "a=1" -> {a: 1, b: 2}
std::map<std::string, std::string> ParsePairs(const std::string& text, char separator) {
  std::map<std::string, std::string> pairs;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, separator)) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) throw std::invalid_argument("expected NAME=VALUE, got '" + item + "'");
    pairs[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return pairs;
}

Options ParseArguments(int argc, char** argv) {
  if (argc < 3) throw std::invalid_argument("usage: run_fused_model MODEL.onnx LIBRARY.so [options] (see the source)");
  Options options;
  options.model = argv[1];
  options.library = argv[2];
  for (int i = 3; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--dim") {
      for (const auto& [name, size] : ParsePairs(value, ',')) options.dims[name] = std::stoll(size);
    } else if (flag == "--input") {
      for (const auto& [name, file] : ParsePairs(value, ',')) options.input_files[name] = file;
    } else if (flag == "--seed") {
      options.seed = static_cast<unsigned>(std::stoul(value));
    } else if (flag == "--threads") {
      options.threads = std::stoi(value);
    } else if (flag == "--output-dir") {
      options.output_dir = value;
    } else if (flag == "--check") {
      options.check = ParsePairs(value, ',');
    } else {
      throw std::invalid_argument("unknown option " + flag);
    }
  }
  return options;
}

// The session's inputs: read from files or generated; symbolic dims from --dim.
std::vector<Tensor> MakeInputs(Ort::Session& session, const Options& options) {
  Ort::AllocatorWithDefaultOptions allocator;
  std::mt19937 rng(options.seed);
  std::normal_distribution<float> normal(0.3f, 1.0f);
  std::vector<Tensor> inputs;
  for (size_t index = 0; index < session.GetInputCount(); ++index) {
    Tensor tensor;
    tensor.name = session.GetInputNameAllocated(index, allocator).get();
    const Ort::TypeInfo type_info = session.GetInputTypeInfo(index);
    const auto info = type_info.GetTensorTypeAndShapeInfo();
    tensor.type = info.GetElementType();
    if (!TypeName(tensor.type)) throw std::runtime_error("input '" + tensor.name + "' is not float32/float16/bfloat16");
    tensor.shape = info.GetShape();
    std::vector<const char*> symbols(tensor.shape.size());
    info.GetSymbolicDimensions(symbols.data(), symbols.size());
    size_t count = 1;
    for (size_t d = 0; d < tensor.shape.size(); ++d) {
      if (tensor.shape[d] < 0) {
        const auto set = options.dims.find(symbols[d] ? symbols[d] : "");
        tensor.shape[d] = set != options.dims.end() ? set->second : 1;
      }
      count *= static_cast<size_t>(tensor.shape[d]);
    }
    tensor.bytes.resize(count * tensor.ElementSize());
    const auto file = options.input_files.find(tensor.name);
    if (file != options.input_files.end()) {
      std::ifstream in(file->second, std::ios::binary);
      in.read(reinterpret_cast<char*>(tensor.bytes.data()), static_cast<std::streamsize>(tensor.bytes.size()));
      if (!in || in.peek() != std::char_traits<char>::eof()) {
        throw std::runtime_error(file->second + ": expected exactly " + std::to_string(tensor.bytes.size()) +
                                 " bytes for input '" + tensor.name + "' " + TypeName(tensor.type) +
                                 ShapeText(tensor.shape));
      }
    } else {
      for (size_t i = 0; i < count; ++i) tensor.Set(i, normal(rng));
    }
    inputs.push_back(std::move(tensor));
  }
  return inputs;
}

std::vector<Tensor> Run(Ort::Session& session, std::vector<Tensor>& inputs) {
  const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::vector<Ort::Value> values;
  std::vector<const char*> input_names;
  for (Tensor& tensor : inputs) {
    values.push_back(Ort::Value::CreateTensor(cpu, tensor.bytes.data(), tensor.bytes.size(), tensor.shape.data(),
                                              tensor.shape.size(), tensor.type));
    input_names.push_back(tensor.name.c_str());
  }
  Ort::AllocatorWithDefaultOptions allocator;
  std::vector<std::string> output_names;
  for (size_t index = 0; index < session.GetOutputCount(); ++index) {
    output_names.push_back(session.GetOutputNameAllocated(index, allocator).get());
  }
  std::vector<const char*> output_name_ptrs;
  for (const std::string& name : output_names) output_name_ptrs.push_back(name.c_str());

  std::vector<Ort::Value> results = session.Run(Ort::RunOptions{nullptr}, input_names.data(), values.data(),
                                                values.size(), output_name_ptrs.data(), output_name_ptrs.size());
  std::vector<Tensor> outputs;
  for (size_t index = 0; index < results.size(); ++index) {
    const auto info = results[index].GetTensorTypeAndShapeInfo();
    Tensor tensor{output_names[index], info.GetElementType(), info.GetShape(), {}};
    if (!TypeName(tensor.type)) throw std::runtime_error("output '" + tensor.name + "' has an unexpected type");
    const auto* data = static_cast<const uint8_t*>(results[index].GetTensorRawData());
    tensor.bytes.assign(data, data + info.GetElementCount() * tensor.ElementSize());
    outputs.push_back(std::move(tensor));
  }
  return outputs;
}

void Print(const Tensor& tensor) {
  double sum_abs = 0.0;
  for (size_t i = 0; i < tensor.Count(); ++i) sum_abs += std::fabs(tensor.At(i));
  std::printf("%s: %s%s, mean |value| %.6g, first values:", tensor.name.c_str(), TypeName(tensor.type),
              ShapeText(tensor.shape).c_str(), tensor.Count() ? sum_abs / static_cast<double>(tensor.Count()) : 0.0);
  for (size_t i = 0; i < std::min<size_t>(tensor.Count(), 6); ++i) std::printf(" %.6g", tensor.At(i));
  std::printf("\n");
}

// ---- the float64 reference of the ops (README, "The operators") ------------------------------------------------

// Relative tolerance versus float64: one rounding to the type plus float32 arithmetic; absolute floor: the type's
// smallest subnormal.
void Tolerance(ONNXTensorElementDataType type, double* rtol, double* atol) {
  int unit_roundoff_exponent = -8, smallest_subnormal_exponent = -133;  // bfloat16
  if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    unit_roundoff_exponent = -24;
    smallest_subnormal_exponent = -149;
  } else if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16) {
    unit_roundoff_exponent = -11;
    smallest_subnormal_exponent = -24;
  }
  *rtol = std::ldexp(1.0, unit_roundoff_exponent) + 40 * std::ldexp(1.0, -24);
  *atol = std::ldexp(1.0, smallest_subnormal_exponent);
}

// Returns true when output 0 (and SkipRMSNorm's sum output) match the reference.
bool Check(const std::map<std::string, std::string>& spec, const std::vector<Tensor>& inputs,
           const std::vector<Tensor>& outputs) {
  auto get = [&](const char* key, const char* fallback) {
    const auto it = spec.find(key);
    return it != spec.end() ? it->second : std::string(fallback);
  };
  const std::string op = get("op", "RMSNorm");
  const bool skip = op == "SkipRMSNorm";
  if (!skip && op != "RMSNorm") throw std::invalid_argument("--check op must be RMSNorm or SkipRMSNorm");
  const double epsilon = static_cast<float>(std::stod(get("epsilon", "1e-5")));  // the attribute is a float
  const bool outside = get("eps_outside_sqrt", "0") == "1";
  const size_t scale_index = skip ? 2 : 1;
  if (inputs.size() < scale_index || inputs.size() > scale_index + 1) {
    throw std::invalid_argument("--check: the model's inputs must be X" + std::string(skip ? ", skip" : "") +
                                " and optionally scale");
  }
  const Tensor& x = inputs[0];
  const Tensor* scale = inputs.size() > scale_index ? &inputs[scale_index] : nullptr;
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  int64_t axis = std::stoll(get("axis", "-1"));
  axis = axis < 0 ? axis + rank : axis;
  int64_t cols = 1;
  for (int64_t d = axis; d < rank; ++d) cols *= x.shape[static_cast<size_t>(d)];

  // h: the normalized values (X, or round_T(X + skip)).
  std::vector<double> h(x.Count());
  for (size_t i = 0; i < h.size(); ++i) h[i] = skip ? x.Rounded(x.At(i) + inputs[1].At(i)) : x.At(i);

  double rtol, atol, worst = 0.0;
  Tolerance(x.type, &rtol, &atol);
  size_t failures = 0;
  for (size_t row = 0; cols > 0 && row < h.size() / static_cast<size_t>(cols); ++row) {
    const double* v = &h[row * static_cast<size_t>(cols)];
    double sum_squares = 0.0;
    for (int64_t c = 0; c < cols; ++c) sum_squares += v[c] * v[c];
    const double mean_square = sum_squares / static_cast<double>(cols);
    const double denominator = outside ? std::sqrt(mean_square) + epsilon : std::sqrt(mean_square + epsilon);
    for (int64_t c = 0; c < cols; ++c) {
      double gain = 1.0;
      if (scale) {  // right-aligned broadcast of scale over X's trailing dims
        int64_t rest = c, index = 0, stride = 1;
        for (size_t k = 1; k <= scale->shape.size(); ++k) {
          const int64_t x_dim = x.shape[x.shape.size() - k], scale_dim = scale->shape[scale->shape.size() - k];
          const int64_t digit = static_cast<int64_t>(k) <= rank - axis ? rest % x_dim : 0;
          if (static_cast<int64_t>(k) <= rank - axis) rest /= x_dim;
          if (scale_dim != 1) index += digit * stride;
          stride *= scale_dim;
        }
        gain = scale->At(static_cast<size_t>(index));
      }
      const size_t i = row * static_cast<size_t>(cols) + static_cast<size_t>(c);
      const double want = v[c] / denominator * gain, got = outputs[0].At(i);
      const bool nan_ok = std::isnan(want) && std::isnan(got);
      const double error = nan_ok || got == want ? 0.0 : std::fabs(got - want) / (atol + rtol * std::fabs(want));
      if (!(error <= 1.0)) ++failures;
      if (!(error <= worst)) worst = error;
    }
  }
  std::printf("check %s: %zu elements vs float64 reference, worst error %.3g x tolerance (rtol %.3g, atol %.3g): %s\n",
              op.c_str(), h.size(), worst, rtol, atol, failures ? "FAILED" : "ok");
  bool ok = failures == 0;
  if (skip && outputs.size() > 1) {
    size_t differ = 0;
    for (size_t i = 0; i < h.size(); ++i) {
      const float got = outputs[1].At(i), want = static_cast<float>(h[i]);
      differ += !(got == want || (std::isnan(got) && std::isnan(want)));
    }
    std::printf("check sum output = round_T(X + skip): %zu of %zu differ: %s\n", differ, h.size(),
                differ ? "FAILED" : "ok");
    ok = ok && differ == 0;
  }
  return ok;
}

void WriteRaw(const std::string& dir, const Tensor& tensor) {
  const std::string path = dir + "/" + tensor.name + ".bin";
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(tensor.bytes.data()), static_cast<std::streamsize>(tensor.bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options options = ParseArguments(argc, argv);
    Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "run_fused_model");
    Ort::SessionOptions session_options;
    if (options.threads > 0) session_options.SetIntraOpNumThreads(options.threads);
    // The custom-op library, by path: onnxruntime loads it and calls its RegisterCustomOps.
    session_options.RegisterCustomOpsLibrary(options.library.c_str());
    Ort::Session session(env, options.model.c_str(), session_options);
    std::printf("onnxruntime %s, model %s, ops from %s\n", Ort::GetVersionString().c_str(), options.model.c_str(),
                options.library.c_str());

    std::vector<Tensor> inputs = MakeInputs(session, options);
    for (const Tensor& input : inputs) Print(input);
    const std::vector<Tensor> outputs = Run(session, inputs);
    for (const Tensor& output : outputs) {
      Print(output);
      if (!options.output_dir.empty()) WriteRaw(options.output_dir, output);
    }
    if (!options.check.empty() && !Check(options.check, inputs, outputs)) return 1;
    return 0;
  } catch (const Ort::Exception& e) {
    std::fprintf(stderr, "onnxruntime error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 2;
}
