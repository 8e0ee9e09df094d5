// Jinja builtins: filters, tests and the string/dict methods chat templates call, with Python's
// behaviour (upper/lower/title change ASCII letters only).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/jinja_ast.h"

namespace moe::engine::jinja {
namespace {

const std::string& Str(const Value& v, const char* what) {
  if (!v.is_json() || !v.json().is_string()) {
    throw RenderError(absl::StrCat(what, " needs a string, not '", TypeName(v), "'"));
  }
  return v.json().get_ref<const std::string&>();
}

int64_t Int(const Value& v, const char* what, int64_t fallback) {
  if (v.undefined() || (v.is_json() && v.json().is_null())) return fallback;
  if (!v.is_json() || !v.json().is_number_integer()) {
    throw RenderError(absl::StrCat(what, " needs an integer, not '", TypeName(v), "'"));
  }
  return v.json().get<int64_t>();
}

// Python's str.isspace() characters, as UTF-8.
const char* const kPythonSpaces[] = {" ",      "\t",     "\n",     "\v",     "\f",     "\r",
                                     "\x1c",   "\x1d",   "\x1e",   "\x1f",   "\u0085", "\u00a0",
                                     "\u1680", "\u2000", "\u2001", "\u2002", "\u2003", "\u2004",
                                     "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a",
                                     "\u2028", "\u2029", "\u202f", "\u205f", "\u3000"};

// Length of the whitespace character at s[i] (or ending at s[i-1] when `back`), 0 if none.
size_t SpaceAt(const std::string& s, size_t i, bool back) {
  for (const char* sp : kPythonSpaces) {
    const size_t n = std::strlen(sp);
    if (back ? (i >= n && s.compare(i - n, n, sp) == 0) : s.compare(i, n, sp) == 0) return n;
  }
  return 0;
}

// str.strip/lstrip/rstrip: whitespace, or any character of `chars` (code points).
std::string Strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::vector<std::string> set;
  const bool custom = chars.is_json() && chars.json().is_string();
  if (custom) {
    for (const Value& c : chars.Iterate()) set.push_back(c.json().get<std::string>());
  }
  auto match = [&](size_t i, bool back) -> size_t {
    if (!custom) return SpaceAt(s, i, back);
    for (const std::string& c : set) {
      if (back ? (i >= c.size() && s.compare(i - c.size(), c.size(), c) == 0)
               : s.compare(i, c.size(), c) == 0) {
        return c.size();
      }
    }
    return 0;
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      const size_t n = match(b, false);
      if (n == 0) break;
      b += n;
    }
  }
  if (right) {
    while (e > b) {
      const size_t n = match(e, true);
      if (n == 0) break;
      e -= n;
    }
  }
  return s.substr(b, e - b);
}

std::string AsciiCase(const std::string& s, bool upper) {
  return upper ? absl::AsciiStrToUpper(s) : absl::AsciiStrToLower(s);
}

bool IsAsciiLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string Title(const std::string& s) {
  std::string out = s;
  bool in_word = false;
  for (char& c : out) {
    if (IsAsciiLetter(c)) {
      c = in_word ? absl::ascii_tolower(c) : absl::ascii_toupper(c);
      in_word = true;
    } else {
      // Non-ASCII bytes (é, ß) count as letters of the word, as Python counts cased letters.
      in_word = (static_cast<unsigned char>(c) & 0x80) != 0 && in_word;
    }
  }
  return out;
}

std::string Capitalize(const std::string& s) {
  std::string out = AsciiCase(s, false);
  if (!out.empty()) out[0] = absl::ascii_toupper(out[0]);
  return out;
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  if (from.empty()) return s;  // Python inserts `to` between characters; no template needs it
  std::string out;
  size_t i = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t j = s.find(from, i);
    if (j == std::string::npos) break;
    out.append(s, i, j - i);
    out += to;
    i = j + from.size();
  }
  out.append(s, i, std::string::npos);
  return out;
}

Json Split(const std::string& s, const Value& sep, int64_t maxsplit) {
  Json out = Json::array();
  if (sep.is_json() && sep.json().is_string()) {
    const std::string& d = sep.json().get_ref<const std::string&>();
    if (d.empty()) throw RenderError("split: empty separator");
    size_t i = 0;
    for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
      const size_t j = s.find(d, i);
      if (j == std::string::npos) break;
      out.push_back(s.substr(i, j - i));
      i = j + d.size();
    }
    out.push_back(s.substr(i));
    return out;
  }
  // No separator: runs of whitespace split, and no empty strings.
  size_t i = 0;
  int64_t n = 0;
  while (i < s.size()) {
    while (i < s.size() && SpaceAt(s, i, false) > 0) i += SpaceAt(s, i, false);
    if (i >= s.size()) break;
    if (maxsplit >= 0 && n == maxsplit) {
      out.push_back(Strip(s.substr(i), Value(), false, true));
      return out;
    }
    size_t j = i;
    while (j < s.size() && SpaceAt(s, j, false) == 0) ++j;
    out.push_back(s.substr(i, j - i));
    ++n;
    i = j;
  }
  return out;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// The attribute path "a.b" of a value, as map/selectattr read it.
Value Attribute(const Value& v, const std::string& path) {
  Value cur = v;
  size_t i = 0;
  while (true) {
    const size_t dot = path.find('.', i);
    const std::string part = path.substr(i, dot == std::string::npos ? std::string::npos : dot - i);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = numeric ? cur.Item(Json(std::stoll(part))) : cur.Item(part);
    if (dot == std::string::npos) return cur;
    i = dot + 1;
  }
}

// select/reject/selectattr/rejectattr: `test` with the arguments after it.
bool Passes(const Value& v, const Args& args, size_t test_at) {
  if (args.positional.size() <= test_at) return Truthy(v);
  const std::string& test = Str(args.positional[test_at], "the test name");
  if (!IsTest(test)) throw RenderError(absl::StrCat("unknown test '", test, "'"));
  Args rest;
  rest.positional.assign(args.positional.begin() + static_cast<long>(test_at) + 1,
                         args.positional.end());
  return ApplyTest(test, v, rest);
}

Json List(const Value& v) {
  Json out = Json::array();
  for (const Value& e : v.Iterate()) out.push_back(ToJsonValue(e));
  return out;
}

bool IsInt(const Value& v) { return v.is_json() && v.json().is_number_integer(); }

}  // namespace

Value Args::Get(size_t i, const char* name) const {
  for (const auto& [k, v] : named) {
    if (k == name) return v;
  }
  return i < positional.size() ? positional[i] : Value();
}

Value ApplyFilter(const std::string& name, const Value& in, const Args& args) {
  if (name == "tojson") {
    return Value(Json(ToJson(ToJsonValue(in),
                             static_cast<int>(Int(args.Get(0, "indent"), "tojson indent", -1)))));
  }
  if (name == "safe") return in;
  if (name == "string") return Value(Json(ToString(in)));
  if (name == "e" || name == "escape" || name == "forceescape") {
    return Value(Json(HtmlEscape(ToString(in))));
  }
  if (name == "trim") return Value(Json(Strip(Str(in, "trim"), args.Get(0, "chars"), true, true)));
  if (name == "upper") return Value(Json(AsciiCase(Str(in, "upper"), true)));
  if (name == "lower") return Value(Json(AsciiCase(Str(in, "lower"), false)));
  if (name == "title") return Value(Json(Title(Str(in, "title"))));
  if (name == "capitalize") return Value(Json(Capitalize(Str(in, "capitalize"))));
  if (name == "replace") {
    return Value(Json(Replace(Str(in, "replace"), Str(args.Get(0, "old"), "replace"),
                              Str(args.Get(1, "new"), "replace"),
                              Int(args.Get(2, "count"), "replace count", -1))));
  }
  if (name == "length" || name == "count") {
    if (in.undefined()) return Value(Json(0));
    if (in.kind() == Value::Kind::kJson &&
        (in.json().is_string() || in.json().is_array() || in.json().is_object())) {
      return Value(Json(in.json().is_string() ? in.Iterate().size() : in.json().size()));
    }
    throw RenderError(absl::StrCat("object of type '", TypeName(in), "' has no len()"));
  }
  if (name == "default" || name == "d") {
    const bool boolean = Truthy(args.Get(1, "boolean"));
    if (in.undefined() || (boolean && !Truthy(in))) {
      Value fallback = args.Get(0, "default_value");
      return fallback.undefined() ? Value(Json("")) : fallback;
    }
    return in;
  }
  if (name == "join") {
    const Value sep = args.Get(0, "d");
    const Value attr = args.Get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& e : in.Iterate()) {
      if (!first && !sep.undefined()) out += Str(sep, "join");
      first = false;
      out += ToString(attr.undefined() ? e : Attribute(e, ToString(attr)));
    }
    return Value(Json(std::move(out)));
  }
  if (name == "items") {
    if (in.undefined()) return Value(Json::array());
    if (!in.is_json() || !in.json().is_object()) {
      throw RenderError(absl::StrCat("items needs a dict, not '", TypeName(in), "'"));
    }
    Json out = Json::array();
    for (auto it = in.json().begin(); it != in.json().end(); ++it) {
      out.push_back(Json::array({it.key(), it.value()}));
    }
    return Value(std::move(out));
  }
  if (name == "first" || name == "last") {
    std::vector<Value> items = in.Iterate();
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value(List(in));
  if (name == "reverse") {
    if (in.is_json() && in.json().is_string()) {
      std::vector<Value> chars = in.Iterate();
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->json().get<std::string>();
      return Value(Json(std::move(out)));
    }
    Json out = List(in);
    std::reverse(out.begin(), out.end());
    return Value(std::move(out));
  }
  if (name == "unique") {
    Json out = Json::array();
    for (const Value& e : in.Iterate()) {
      bool seen = false;
      for (const Json& o : out) seen = seen || Equal(Value(o), e);
      if (!seen) out.push_back(ToJsonValue(e));
    }
    return Value(std::move(out));
  }
  if (name == "int") {
    if (IsInt(in)) return in;
    if (in.is_json() && in.json().is_number_float()) {
      return Value(Json(static_cast<int64_t>(std::trunc(in.json().get<double>()))));
    }
    if (in.is_json() && in.json().is_boolean()) return Value(Json(in.json().get<bool>() ? 1 : 0));
    if (in.is_json() && in.json().is_string()) {
      try {
        return Value(Json(std::stoll(Strip(in.json().get<std::string>(), Value(), true, true))));
      } catch (const std::exception&) {
      }
    }
    Value fallback = args.Get(0, "default");
    return fallback.undefined() ? Value(Json(0)) : fallback;
  }
  if (name == "float") {
    if (in.is_json() && in.json().is_number()) return Value(Json(in.json().get<double>()));
    if (in.is_json() && in.json().is_string()) {
      try {
        return Value(Json(std::stod(in.json().get<std::string>())));
      } catch (const std::exception&) {
      }
    }
    Value fallback = args.Get(0, "default");
    return fallback.undefined() ? Value(Json(0.0)) : fallback;
  }
  if (name == "abs") {
    if (IsInt(in)) return Value(Json(std::abs(in.json().get<int64_t>())));
    if (in.is_json() && in.json().is_number())
      return Value(Json(std::fabs(in.json().get<double>())));
    throw RenderError(absl::StrCat("abs needs a number, not '", TypeName(in), "'"));
  }
  if (name == "map") {
    Json out = Json::array();
    const Value attr = args.Get(99, "attribute");
    for (const Value& e : in.Iterate()) {
      if (!attr.undefined()) {
        Value v = Attribute(e, ToString(attr));
        if (v.undefined()) v = args.Get(99, "default");
        out.push_back(ToJsonValue(v));
      } else {
        Args rest;
        rest.positional.assign(args.positional.begin() + (args.positional.empty() ? 0 : 1),
                               args.positional.end());
        out.push_back(ToJsonValue(ApplyFilter(Str(args.Get(0, "filter"), "map"), e, rest)));
      }
    }
    return Value(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool attr = name.size() > 6;
    const bool keep = name[0] == 's';
    Json out = Json::array();
    for (const Value& e : in.Iterate()) {
      const Value subject = attr ? Attribute(e, Str(args.Get(0, "attribute"), name.c_str())) : e;
      if (Passes(subject, args, attr ? 1 : 0) == keep) out.push_back(ToJsonValue(e));
    }
    return Value(std::move(out));
  }
  if (name == "indent") {
    const Value width = args.Get(0, "width");
    const std::string pad =
        width.is_json() && width.json().is_string()
            ? width.json().get<std::string>()
            : std::string(static_cast<size_t>(Int(width, "indent width", 4)), ' ');
    const bool first = Truthy(args.Get(1, "first"));
    const bool blank = Truthy(args.Get(2, "blank"));
    const std::string& s = Str(in, "indent");
    std::string out;
    size_t i = 0;
    for (bool is_first = true; i <= s.size(); is_first = false) {
      size_t j = s.find('\n', i);
      const std::string line = s.substr(i, j == std::string::npos ? std::string::npos : j - i);
      if ((!is_first || first) && (blank || !line.empty())) out += pad;
      out += line;
      if (j == std::string::npos) break;
      out += "\n";
      i = j + 1;
    }
    return Value(Json(std::move(out)));
  }
  if (name == "sum") {
    Value total(Json(0));
    for (const Value& e : in.Iterate()) {
      const Value x = args.Get(0, "attribute").undefined()
                          ? e
                          : Attribute(e, ToString(args.Get(0, "attribute")));
      if (!x.is_json() || !x.json().is_number()) throw RenderError("sum needs numbers");
      total = IsInt(total) && IsInt(x)
                  ? Value(Json(total.json().get<int64_t>() + x.json().get<int64_t>()))
                  : Value(Json(total.json().get<double>() + x.json().get<double>()));
    }
    return total;
  }
  if (name == "sort" || name == "min" || name == "max" || name == "dictsort") {
    std::vector<Value> items;
    if (name == "dictsort") {
      for (const Json& kv : ApplyFilter("items", in, Args()).json()) items.emplace_back(kv);
    } else {
      items = in.Iterate();
    }
    const Value attr = args.Get(99, "attribute");
    auto key = [&](const Value& v) {
      if (name == "dictsort") return v.Item(Json(0));
      return attr.undefined() ? v : Attribute(v, ToString(attr));
    };
    std::stable_sort(items.begin(), items.end(),
                     [&](const Value& a, const Value& b) { return Compare(key(a), key(b)) < 0; });
    if (name == "min" || name == "max") {
      if (items.empty()) return Value();
      return name == "min" ? items.front() : items.back();
    }
    if (Truthy(args.Get(0, "reverse"))) std::reverse(items.begin(), items.end());
    Json out = Json::array();
    for (const Value& v : items) out.push_back(ToJsonValue(v));
    return Value(std::move(out));
  }
  throw RenderError(absl::StrCat("unknown filter '", name, "'"));
}

bool IsFilter(const std::string& name) {
  static const std::set<std::string> kFilters = {
      "abs",        "capitalize", "count",      "d",           "default", "dictsort", "e",
      "escape",     "first",      "float",      "forceescape", "indent",  "int",      "items",
      "join",       "last",       "length",     "list",        "lower",   "map",      "max",
      "min",        "reject",     "rejectattr", "replace",     "reverse", "safe",     "select",
      "selectattr", "sort",       "string",     "sum",         "title",   "tojson",   "trim",
      "unique",     "upper"};
  return kFilters.count(name) > 0;
}

bool IsTest(const std::string& name) {
  static const std::set<std::string> kTests = {
      "defined", "undefined",   "none",     "string",   "mapping", "iterable", "number", "integer",
      "float",   "boolean",     "sequence", "true",     "false",   "equalto",  "eq",     "==",
      "sameas",  "ne",          "!=",       "lt",       "le",      "gt",       "ge",     "odd",
      "even",    "divisibleby", "in",       "callable", "lower",   "upper"};
  return kTests.count(name) > 0;
}

bool ApplyTest(const std::string& name, const Value& v, const Args& args) {
  const bool json = v.is_json();
  const Json* j = json ? &v.json() : nullptr;
  if (name == "defined") return !v.undefined();
  if (name == "undefined") return v.undefined();
  if (name == "none") return json && j->is_null();
  if (name == "string") return json && j->is_string();
  if (name == "mapping") return json && j->is_object();
  if (name == "iterable" || name == "sequence") {
    return json && (j->is_string() || j->is_array() || j->is_object());
  }
  if (name == "number") return json && (j->is_number() || j->is_boolean());  // Python: bool is int
  if (name == "integer") return json && j->is_number_integer();
  if (name == "float") return json && j->is_number_float();
  if (name == "boolean") return json && j->is_boolean();
  if (name == "true") return json && j->is_boolean() && j->get<bool>();
  if (name == "false") return json && j->is_boolean() && !j->get<bool>();
  if (name == "callable") return v.kind() == Value::Kind::kMacro;
  if (name == "lower" || name == "upper") {
    return json && j->is_string() &&
           AsciiCase(j->get<std::string>(), name == "upper") == j->get<std::string>();
  }
  const Value other = args.Get(0, "other");
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return Equal(v, other);
  if (name == "ne" || name == "!=") return !Equal(v, other);
  if (name == "lt") return Compare(v, other) < 0;
  if (name == "le") return Compare(v, other) <= 0;
  if (name == "gt") return Compare(v, other) > 0;
  if (name == "ge") return Compare(v, other) >= 0;
  if (name == "in") {
    for (const Value& e : other.Iterate()) {
      if (Equal(e, v)) return true;
    }
    return other.is_json() && other.json().is_string() && json && j->is_string() &&
           other.json().get<std::string>().find(j->get<std::string>()) != std::string::npos;
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    const int64_t x = Int(v, name.c_str(), 0);
    if (name == "divisibleby") {
      const int64_t d = Int(other, "divisibleby", 1);
      return d != 0 && x % d == 0;
    }
    return (x % 2 != 0) == (name == "odd");
  }
  throw RenderError(absl::StrCat("unknown test '", name, "'"));
}

Value CallMethod(const Value& obj, const std::string& name, const Args& args, bool* found) {
  *found = true;
  if (obj.is_json() && obj.json().is_string()) {
    const std::string& s = obj.json().get_ref<const std::string&>();
    if (name == "startswith" || name == "endswith") {
      const Value arg = args.Get(0, "prefix");
      std::vector<std::string> options;
      if (arg.is_json() && arg.json().is_array()) {
        for (const Value& o : arg.Iterate()) options.push_back(Str(o, name.c_str()));
      } else {
        options.push_back(Str(arg, name.c_str()));
      }
      for (const std::string& o : options) {
        if (o.size() <= s.size() &&
            s.compare(name == "startswith" ? 0 : s.size() - o.size(), o.size(), o) == 0) {
          return Value(Json(true));
        }
      }
      return Value(Json(false));
    }
    if (name == "strip") return Value(Json(Strip(s, args.Get(0, "chars"), true, true)));
    if (name == "lstrip") return Value(Json(Strip(s, args.Get(0, "chars"), true, false)));
    if (name == "rstrip") return Value(Json(Strip(s, args.Get(0, "chars"), false, true)));
    if (name == "split") {
      return Value(Split(s, args.Get(0, "sep"), Int(args.Get(1, "maxsplit"), "maxsplit", -1)));
    }
    if (name == "upper" || name == "lower") return Value(Json(AsciiCase(s, name == "upper")));
    if (name == "title") return Value(Json(Title(s)));
    if (name == "capitalize") return Value(Json(Capitalize(s)));
    if (name == "replace") {
      return Value(
          Json(Replace(s, Str(args.Get(0, "old"), "replace"), Str(args.Get(1, "new"), "replace"),
                       Int(args.Get(2, "count"), "replace count", -1))));
    }
    if (name == "find") {
      const size_t at = s.find(Str(args.Get(0, "sub"), "find"));
      return Value(Json(at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(at)));
    }
    if (name == "count") {
      const std::string& sub = Str(args.Get(0, "sub"), "count");
      int64_t n = 0;
      for (size_t at = s.find(sub); !sub.empty() && at != std::string::npos;
           at = s.find(sub, at + sub.size()))
        ++n;
      return Value(Json(n));
    }
    if (name == "join") {
      std::string out;
      bool first = true;
      for (const Value& e : args.Get(0, "iterable").Iterate()) {
        if (!first) out += s;
        first = false;
        out += Str(e, "join");
      }
      return Value(Json(std::move(out)));
    }
    if (name == "format") {  // fields "{}", "{0}", "{name}"; specs and conversions refused
      std::string out;
      size_t next = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s.compare(i, 2, "{{") == 0 || s.compare(i, 2, "}}") == 0) {
          out.push_back(s[i++]);
          continue;
        }
        if (s[i] != '{') {
          out.push_back(s[i]);
          continue;
        }
        const size_t close = s.find('}', i);
        if (close == std::string::npos) throw RenderError("format: unclosed '{'");
        const std::string field = s.substr(i + 1, close - i - 1);
        if (field.find_first_of(":!.[") != std::string::npos) {
          throw RenderError(absl::StrCat("format: field '{", field,
                                         "}' (format specs, conversions and lookups are not "
                                         "supported)"));
        }
        if (field.size() > 9 && std::all_of(field.begin(), field.end(), ::isdigit)) {
          throw RenderError(absl::StrCat("format: field '{", field, "}' is out of range"));
        }
        Value arg = field.empty() ? args.Get(next++, "")
                    : std::all_of(field.begin(), field.end(), ::isdigit)
                        ? args.Get(std::stoul(field), "")
                        : args.Get(999, field.c_str());
        out += ToString(arg);
        i = close;
      }
      return Value(Json(std::move(out)));
    }
  }
  if (obj.is_json() && obj.json().is_object()) {
    if (name == "get") {
      Value v = obj.Item(args.Get(0, "key").is_json() ? args.Get(0, "key").json() : Json());
      if (!v.undefined()) return v;
      Value fallback = args.Get(1, "default");
      return fallback.undefined() ? Value(Json(nullptr)) : fallback;
    }
    if (name == "items") return ApplyFilter("items", obj, Args());
    if (name == "keys" || name == "values") {
      Json out = Json::array();
      for (auto it = obj.json().begin(); it != obj.json().end(); ++it) {
        out.push_back(name == "keys" ? Json(it.key()) : it.value());
      }
      return Value(std::move(out));
    }
  }
  if (obj.undefined()) {
    throw RenderError(absl::StrCat("cannot call '", name, "' on an undefined value"));
  }
  *found = false;
  return Value();
}

}  // namespace moe::engine::jinja
