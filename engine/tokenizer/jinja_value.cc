// Jinja runtime values: lookup, iteration, truth, Python str()/repr, json.dumps, comparisons.
#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/jinja_ast.h"

namespace moe::engine::jinja {

Value::Value(Json json)
    : kind_(Kind::kJson),
      root_(std::make_shared<const Json>(std::move(json))),
      node_(root_.get()) {}

Value Value::Ref(std::shared_ptr<const Json> root, const Json* node) {
  Value v;
  v.kind_ = Kind::kJson;
  v.root_ = std::move(root);
  v.node_ = node;
  return v;
}

Value Value::OfNamespace(std::shared_ptr<Namespace> ns) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.ns_ = std::move(ns);
  return v;
}

Value Value::OfMacro(const Node* macro) {
  Value v;
  v.kind_ = Kind::kMacro;
  v.macro_ = macro;
  return v;
}

Value Value::Item(const Json& key) const {
  if (kind_ == Kind::kNamespace && key.is_string()) {
    auto it = ns_->attrs.find(key.get<std::string>());
    return it == ns_->attrs.end() ? Value() : it->second;
  }
  if (kind_ != Kind::kJson) return Value();
  if (node_->is_object() && key.is_string()) {
    auto it = node_->find(key.get<std::string>());
    return it == node_->end() ? Value() : Ref(root_, &*it);
  }
  if ((node_->is_array() || node_->is_string()) && key.is_number_integer()) {
    // Python indexing: negative counts from the end; strings index by character.
    std::vector<Value> chars = node_->is_string() ? Iterate() : std::vector<Value>();
    const int64_t n = static_cast<int64_t>(node_->is_array() ? node_->size() : chars.size());
    int64_t i = key.get<int64_t>();
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();
    if (node_->is_array()) return Ref(root_, &(*node_)[static_cast<size_t>(i)]);
    return chars[static_cast<size_t>(i)];
  }
  return Value();
}

std::vector<Value> Value::Iterate() const {
  std::vector<Value> out;
  if (kind_ == Kind::kUndefined) return out;
  if (kind_ != Kind::kJson)
    throw RenderError(absl::StrCat("'", TypeName(*this), "' is not iterable"));
  if (node_->is_array()) {
    for (const Json& e : *node_) out.push_back(Ref(root_, &e));
  } else if (node_->is_object()) {
    for (auto it = node_->begin(); it != node_->end(); ++it) out.emplace_back(Json(it.key()));
  } else if (node_->is_string()) {
    const std::string& s = node_->get_ref<const std::string&>();
    for (size_t i = 0; i < s.size();) {
      size_t n = 1;
      while (i + n < s.size() && (static_cast<unsigned char>(s[i + n]) & 0xC0) == 0x80) ++n;
      out.emplace_back(Json(s.substr(i, n)));
      i += n;
    }
  } else {
    throw RenderError(absl::StrCat("'", TypeName(*this), "' is not iterable"));
  }
  return out;
}

bool Truthy(const Value& v) {
  if (v.kind() != Value::Kind::kJson) return !v.undefined();
  const Json& j = v.json();
  switch (j.type()) {
    case Json::value_t::null:
    case Json::value_t::discarded:
      return false;
    case Json::value_t::boolean:
      return j.get<bool>();
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return j.get<int64_t>() != 0;
    case Json::value_t::number_float:
      return j.get<double>() != 0;
    case Json::value_t::string:
      return !j.get_ref<const std::string&>().empty();
    case Json::value_t::array:
    case Json::value_t::object:
    case Json::value_t::binary:
      return !j.empty();
  }
  return false;
}

namespace {

// Python's repr(float): the shortest round-trip digits, positional for 1e-4 <= |x| < 1e16.
std::string PythonFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // e.g. "-1.25e+02"
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string sign = sci[0] == '-' ? "-" : "";
  std::string digits;
  for (size_t i = sign.size(); i < e; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  if (exp < -4 || exp >= 16) {
    // StrCat rather than `"." + string`: GCC 12 at -O3 misreads the latter (-Wrestrict).
    const std::string mantissa =
        digits.size() > 1 ? absl::StrCat(digits.substr(0, 1), ".", digits.substr(1)) : digits;
    return absl::StrCat(sign, mantissa, "e", exp < 0 ? "-" : "+", exp < 10 && exp > -10 ? "0" : "",
                        std::abs(exp));
  }
  if (exp < 0) return absl::StrCat(sign, "0.", std::string(-exp - 1, '0'), digits);
  if (static_cast<int>(digits.size()) <= exp + 1) {
    return absl::StrCat(sign, digits, std::string(exp + 1 - digits.size(), '0'), ".0");
  }
  return absl::StrCat(sign, digits.substr(0, exp + 1), ".", digits.substr(exp + 1));
}

// Python's repr(str): single quotes unless the text has ' and no ".
std::string PythonRepr(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == q) {
          out.push_back('\\');
          out.push_back(c);
        } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back(q);
  return out;
}

// JSON deeper than this (possible in client-sent tools) is an error, not a stack overflow.
constexpr int kMaxJsonDepth = 256;

void AppendStr(const Json& j, bool repr, std::string* out, int depth = 0) {
  if (depth > kMaxJsonDepth) throw RenderError("value nested too deeply to print");
  switch (j.type()) {
    case Json::value_t::null:
    case Json::value_t::discarded:
      *out += "None";
      return;
    case Json::value_t::boolean:
      *out += j.get<bool>() ? "True" : "False";
      return;
    case Json::value_t::number_integer:
      *out += std::to_string(j.get<int64_t>());
      return;
    case Json::value_t::number_unsigned:
      *out += std::to_string(j.get<uint64_t>());
      return;
    case Json::value_t::number_float:
      *out += PythonFloat(j.get<double>());
      return;
    case Json::value_t::string:
      *out += repr ? PythonRepr(j.get_ref<const std::string&>()) : j.get_ref<const std::string&>();
      return;
    case Json::value_t::array: {
      *out += "[";
      bool first = true;
      for (const Json& e : j) {
        if (!first) *out += ", ";
        first = false;
        AppendStr(e, true, out, depth + 1);
      }
      *out += "]";
      return;
    }
    case Json::value_t::object: {
      *out += "{";
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) *out += ", ";
        first = false;
        *out += PythonRepr(it.key());
        *out += ": ";
        AppendStr(it.value(), true, out, depth + 1);
      }
      *out += "}";
      return;
    }
    case Json::value_t::binary:
      *out += "<binary>";
      return;
  }
}

void AppendJsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(c));
          *out += buf;
        } else {
          out->push_back(c);  // ensure_ascii=False: UTF-8 as is
        }
    }
  }
  out->push_back('"');
}

void AppendJson(const Json& j, int indent, int level, std::string* out) {
  if (level > kMaxJsonDepth) throw RenderError("value nested too deeply for tojson");
  const bool pretty = indent >= 0;
  auto newline = [&](int depth) {
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * depth), ' ');
  };
  switch (j.type()) {
    case Json::value_t::string:
      AppendJsonString(j.get_ref<const std::string&>(), out);
      return;
    case Json::value_t::null:
    case Json::value_t::discarded:
      *out += "null";
      return;
    case Json::value_t::boolean:
      *out += j.get<bool>() ? "true" : "false";
      return;
    case Json::value_t::number_float: {
      const double d = j.get<double>();
      *out += std::isnan(d)   ? "NaN"
              : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                              : PythonFloat(d);
      return;
    }
    case Json::value_t::array:
    case Json::value_t::object: {
      const bool is_array = j.is_array();
      if (j.empty()) {
        *out += is_array ? "[]" : "{}";
        return;
      }
      out->push_back(is_array ? '[' : '{');
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) *out += pretty ? "," : ", ";  // Python's separators
        first = false;
        if (pretty) newline(level + 1);
        if (!is_array) {
          AppendJsonString(it.key(), out);
          *out += ": ";
        }
        AppendJson(it.value(), indent, level + 1, out);
      }
      if (pretty) newline(level);
      out->push_back(is_array ? ']' : '}');
      return;
    }
    default:
      AppendStr(j, false, out);
  }
}

int Sign(double d) { return d < 0 ? -1 : d > 0 ? 1 : 0; }

}  // namespace

std::string ToString(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNamespace:
      return "<Namespace>";
    case Value::Kind::kMacro:
      return "<Macro>";
    case Value::Kind::kJson:
      break;
  }
  std::string out;
  AppendStr(v.json(), false, &out);
  return out;
}

std::string ToJson(const Json& j, int indent) {
  std::string out;
  AppendJson(j, indent, 0, &out);
  return out;
}

Json ToJsonValue(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kJson:
      return v.json();
    case Value::Kind::kNamespace: {
      Json obj = Json::object();
      for (const auto& [k, a] : v.ns()->attrs) obj[k] = ToJsonValue(a);
      return obj;
    }
    default:
      return nullptr;
  }
}

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNamespace:
      return "namespace";
    case Value::Kind::kMacro:
      return "macro";
    case Value::Kind::kJson:
      break;
  }
  switch (v.json().type()) {
    case Json::value_t::null:
      return "NoneType";
    case Json::value_t::boolean:
      return "bool";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "int";
    case Json::value_t::number_float:
      return "float";
    case Json::value_t::string:
      return "str";
    case Json::value_t::array:
      return "list";
    case Json::value_t::object:
      return "dict";
    default:
      return "binary";
  }
}

bool Equal(const Value& a, const Value& b) {
  if (!a.is_json() || !b.is_json()) {
    if (a.undefined() || b.undefined()) return a.undefined() && b.undefined();
    return a.ns() == b.ns() && a.macro() == b.macro() && a.kind() == b.kind();
  }
  const Json& x = a.json();
  const Json& y = b.json();
  // Python: 1 == 1.0 == True.
  auto numeric = [](const Json& j) { return j.is_number() || j.is_boolean(); };
  if (numeric(x) && numeric(y)) {
    auto as_double = [](const Json& j) {
      return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>();
    };
    if (x.is_number_integer() && y.is_number_integer()) return x.get<int64_t>() == y.get<int64_t>();
    return as_double(x) == as_double(y);
  }
  return x == y;
}

int Compare(const Value& a, const Value& b) {
  if (a.is_json() && b.is_json()) {
    const Json& x = a.json();
    const Json& y = b.json();
    if ((x.is_number() || x.is_boolean()) && (y.is_number() || y.is_boolean())) {
      if (x.is_number_integer() && y.is_number_integer()) {
        const int64_t p = x.get<int64_t>(), q = y.get<int64_t>();
        return p < q ? -1 : p > q ? 1 : 0;
      }
      auto as_double = [](const Json& j) {
        return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>();
      };
      return Sign(as_double(x) - as_double(y));
    }
    if (x.is_string() && y.is_string()) {
      // UTF-8 byte order is code point order, as Python compares.
      const int c = x.get_ref<const std::string&>().compare(y.get_ref<const std::string&>());
      return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    if (x.is_array() && y.is_array()) {
      for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
        const int c = Compare(Value(x[i]), Value(y[i]));
        if (c != 0) return c;
      }
      return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
    }
  }
  throw RenderError(absl::StrCat("cannot compare '", TypeName(a), "' with '", TypeName(b), "'"));
}

}  // namespace moe::engine::jinja
