// Jinja rendering: walks the statement tree with a stack of variable frames, writing the output.
#include <cmath>
#include <optional>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/jinja_ast.h"

namespace moe::engine {
namespace jinja {
namespace {

constexpr size_t kMaxOutputBytes = size_t{64} << 20;
constexpr int kMaxMacroDepth = 100;
constexpr int64_t kMaxRange = 1'000'000;

enum class Flow { kNormal, kBreak, kContinue };

bool IsNumber(const Value& v) { return v.is_json() && v.json().is_number(); }

[[noreturn]] void OperandError(const std::string& op, const Value& a, const Value& b) {
  throw RenderError(absl::StrCat("unsupported operand types for ", op, ": '", TypeName(a),
                                 "' and '", TypeName(b), "'"));
}

Value Arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "+" && a.is_json() && b.is_json()) {
    const Json& x = a.json();
    const Json& y = b.json();
    if (x.is_string() && y.is_string()) {
      return Value(Json(x.get_ref<const std::string&>() + y.get_ref<const std::string&>()));
    }
    if (x.is_array() && y.is_array()) {
      Json sum = x;
      for (const Json& e : y) sum.push_back(e);
      return Value(std::move(sum));
    }
  }
  if (op == "*" && a.is_json() && b.is_json() && (a.json().is_string() || a.json().is_array()) &&
      b.json().is_number_integer()) {
    Json out = a.json().is_string() ? Json("") : Json::array();
    for (int64_t i = 0; i < b.json().get<int64_t>() && i < kMaxRange; ++i) {
      if (out.is_string()) {
        out.get_ref<std::string&>() += a.json().get_ref<const std::string&>();
      } else {
        for (const Json& e : a.json()) out.push_back(e);
      }
    }
    return Value(std::move(out));
  }
  if (!IsNumber(a) || !IsNumber(b)) OperandError(op, a, b);
  const Json& x = a.json();
  const Json& y = b.json();
  const bool ints = x.is_number_integer() && y.is_number_integer();
  if (ints && op != "/" && op != "**") {
    const int64_t p = x.get<int64_t>(), q = y.get<int64_t>();
    if (op == "+") return Value(Json(p + q));
    if (op == "-") return Value(Json(p - q));
    if (op == "*") return Value(Json(p * q));
    if (q == 0) throw RenderError("integer division or modulo by zero");
    int64_t div = p / q, mod = p % q;
    if (mod != 0 && ((mod < 0) != (q < 0))) {  // Python floors
      --div;
      mod += q;
    }
    return Value(Json(op == "//" ? div : mod));
  }
  const double p = x.get<double>(), q = y.get<double>();
  if (op == "+") return Value(Json(p + q));
  if (op == "-") return Value(Json(p - q));
  if (op == "*") return Value(Json(p * q));
  if (op == "**") {
    if (ints && y.get<int64_t>() >= 0) {
      return Value(Json(static_cast<int64_t>(std::llround(std::pow(p, q)))));
    }
    return Value(Json(std::pow(p, q)));
  }
  if (q == 0) throw RenderError("division by zero");
  if (op == "/") return Value(Json(p / q));
  if (op == "//") return Value(Json(std::floor(p / q)));
  return Value(Json(p - q * std::floor(p / q)));  // %
}

bool Contains(const Value& container, const Value& item) {
  if (container.undefined()) return false;
  if (container.is_json()) {
    const Json& c = container.json();
    if (c.is_string() && item.is_json() && item.json().is_string()) {
      return c.get_ref<const std::string&>().find(item.json().get_ref<const std::string&>()) !=
             std::string::npos;
    }
    if (c.is_array()) {
      for (const Value& e : container.Iterate()) {
        if (Equal(e, item)) return true;
      }
      return false;
    }
    if (c.is_object()) {
      return item.is_json() && item.json().is_string() &&
             c.contains(item.json().get_ref<const std::string&>());
    }
  }
  throw RenderError(absl::StrCat("'in' needs a string, list or dict on its right, not '",
                                 TypeName(container), "'"));
}

// Python's slice of a list or string: x[start:stop:step].
Value Slice(const Value& v, const Value& start, const Value& stop, const Value& step) {
  if (v.undefined()) return Value();
  auto as_int = [](const Value& x, const char* what) -> std::optional<int64_t> {
    if (x.undefined() || (x.is_json() && x.json().is_null())) return std::nullopt;
    if (!x.is_json() || !x.json().is_number_integer()) {
      throw RenderError(absl::StrCat("slice ", what, " must be an integer"));
    }
    return x.json().get<int64_t>();
  };
  const int64_t st = as_int(step, "step").value_or(1);
  if (st == 0) throw RenderError("slice step cannot be zero");
  std::vector<Value> items = v.Iterate();  // characters for a string
  const int64_t n = static_cast<int64_t>(items.size());
  auto clamp = [&](std::optional<int64_t> i, int64_t fallback) {
    if (!i) return fallback;
    int64_t x = *i < 0 ? *i + n : *i;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t from = clamp(as_int(start, "start"), st > 0 ? 0 : n - 1);
  const int64_t to = clamp(as_int(stop, "stop"), st > 0 ? n : -1);
  const bool is_string = v.is_json() && v.json().is_string();
  Json out = is_string ? Json("") : Json::array();
  for (int64_t i = from; st > 0 ? i < to : i > to; i += st) {
    if (is_string) {
      out.get_ref<std::string&>() +=
          items[static_cast<size_t>(i)].json().get_ref<const std::string&>();
    } else {
      out.push_back(ToJsonValue(items[static_cast<size_t>(i)]));
    }
  }
  return Value(std::move(out));
}

class Renderer {
 public:
  explicit Renderer(const Json& context) : context_(std::make_shared<const Json>(context)) {
    frames_.emplace_back();
  }

  std::string Run(const Node& root) {
    Exec(root.body);
    return std::move(out_);
  }

 private:
  using Frame = std::unordered_map<std::string, Value>;

  void Write(const std::string& s) {
    if (out_.size() + s.size() > kMaxOutputBytes) {
      throw RenderError("the output is larger than 64 MiB");
    }
    out_ += s;
  }

  Value Lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    auto it = context_->find(name);
    if (it != context_->end()) return Value::Ref(context_, &*it);
    return Value();
  }

  Flow Exec(const Body& body) {
    for (const auto& node : body) {
      Flow flow = Exec(*node);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow Exec(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kBody:
        return Exec(n.body);
      case Node::Kind::kText:
        Write(n.text);
        return Flow::kNormal;
      case Node::Kind::kOutput:
        Write(ToString(Eval(*n.expr)));
        return Flow::kNormal;
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          if (cond == nullptr || Truthy(Eval(*cond))) return Exec(body);
        }
        return Flow::kNormal;
      case Node::Kind::kFor:
        return ExecFor(n);
      case Node::Kind::kSet: {
        Value value;
        if (n.block_set) {
          std::string saved = std::move(out_);
          out_.clear();
          Exec(n.body);
          value = Value(Json(std::move(out_)));
          out_ = std::move(saved);
        } else {
          value = Eval(*n.expr);
        }
        if (n.attr.empty()) {
          frames_.back()[n.targets[0]] = std::move(value);
        } else {
          Value target = Lookup(n.targets[0]);
          if (target.kind() != Value::Kind::kNamespace) {
            throw RenderError(absl::StrCat("cannot set attribute '", n.attr, "' of '", n.targets[0],
                                           "': it is not a namespace"));
          }
          target.ns()->attrs[n.attr] = std::move(value);
        }
        return Flow::kNormal;
      }
      case Node::Kind::kMacro:
        frames_.back()[n.targets[0]] = Value::OfMacro(&n);
        return Flow::kNormal;
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  void Bind(const std::vector<std::string>& targets, const Value& item, Frame* frame) {
    if (targets.size() == 1) {
      (*frame)[targets[0]] = item;
      return;
    }
    std::vector<Value> parts = item.Iterate();
    if (parts.size() != targets.size()) {
      throw RenderError(absl::StrCat("cannot unpack ", parts.size(), " values into ",
                                     targets.size(), " loop variables"));
    }
    for (size_t i = 0; i < parts.size(); ++i) (*frame)[targets[i]] = parts[i];
  }

  Flow ExecFor(const Node& n) {
    std::vector<Value> items = Eval(*n.expr).Iterate();
    if (n.filter != nullptr) {  // `for x in y if c` filters before loop.* counts
      std::vector<Value> kept;
      for (Value& item : items) {
        frames_.emplace_back();
        Bind(n.targets, item, &frames_.back());
        const bool keep = Truthy(Eval(*n.filter));
        frames_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      return Exec(n.else_body) == Flow::kBreak ? Flow::kBreak : Flow::kNormal;
    }
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      frames_.emplace_back();
      Frame& frame = frames_.back();
      Bind(n.targets, items[static_cast<size_t>(i)], &frame);
      frame["loop"] = Value(Json{{"index", i + 1},
                                 {"index0", i},
                                 {"revindex", length - i},
                                 {"revindex0", length - i - 1},
                                 {"first", i == 0},
                                 {"last", i + 1 == length},
                                 {"length", length}});
      const Flow flow = Exec(n.body);
      frames_.pop_back();
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Args EvalArgs(const Expr& e) {
    Args args;
    for (const ExprPtr& a : e.args) args.positional.push_back(Eval(*a));
    for (const auto& [name, a] : e.kwargs) args.named.emplace_back(name, Eval(*a));
    return args;
  }

  Value CallMacro(const Node& macro, const Args& args) {
    if (args.positional.size() > macro.params.size()) {
      throw RenderError(absl::StrCat("macro '", macro.targets[0], "' takes ", macro.params.size(),
                                     " arguments, not ", args.positional.size()));
    }
    if (macro_depth_ >= kMaxMacroDepth) throw RenderError("macro calls nested too deeply");
    Frame frame;
    for (size_t i = 0; i < macro.params.size(); ++i) {
      const auto& [name, fallback] = macro.params[i];
      Value v = i < args.positional.size() ? args.positional[i] : Value();
      for (const auto& [k, named] : args.named) {
        if (k == name) v = named;
      }
      if (v.undefined() && fallback != nullptr) v = Eval(*fallback);
      frame[name] = std::move(v);
    }
    // The body sees the template's top-level variables and its parameters, not the caller's.
    std::vector<Frame> saved = std::move(frames_);
    frames_ = {saved.front(), std::move(frame)};
    std::string saved_out = std::move(out_);
    out_.clear();
    ++macro_depth_;
    Exec(macro.body);
    --macro_depth_;
    std::string result = std::move(out_);
    out_ = std::move(saved_out);
    frames_ = std::move(saved);
    return Value(Json(std::move(result)));
  }

  Value CallGlobal(const std::string& name, const Args& args) {
    if (name == "raise_exception") throw RenderError(ToString(args.Get(0, "message")));
    if (name == "range") {
      std::vector<int64_t> v;
      for (const Value& a : args.positional) {
        if (!a.is_json() || !a.json().is_number_integer()) {
          throw RenderError("range() takes integer arguments");
        }
        v.push_back(a.json().get<int64_t>());
      }
      if (v.empty() || v.size() > 3) throw RenderError("range() takes 1 to 3 arguments");
      const int64_t start = v.size() > 1 ? v[0] : 0, stop = v.size() > 1 ? v[1] : v[0];
      const int64_t step = v.size() > 2 ? v[2] : 1;
      if (step == 0) throw RenderError("range() step must not be zero");
      Json out = Json::array();
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() >= kMaxRange) throw RenderError("range() is too long");
        out.push_back(i);
      }
      return Value(std::move(out));
    }
    if (name == "namespace" || name == "dict") {
      auto ns = std::make_shared<Namespace>();
      for (const Value& a : args.positional) {  // namespace({'a': 1}) as well as namespace(a=1)
        if (a.is_json() && a.json().is_object()) {
          for (auto it = a.json().begin(); it != a.json().end(); ++it) {
            ns->attrs[it.key()] = Value(it.value());
          }
        }
      }
      for (const auto& [k, v] : args.named) ns->attrs[k] = v;
      if (name == "namespace") return Value::OfNamespace(std::move(ns));
      Json obj = Json::object();
      for (const Value& a : args.positional) {
        if (a.is_json() && a.json().is_object()) obj.update(a.json());
      }
      for (const auto& [k, v] : args.named) obj[k] = ToJsonValue(v);
      return Value(std::move(obj));
    }
    throw RenderError(absl::StrCat("'", name, "' is undefined and cannot be called"));
  }

  Value Call(const Expr& e) {
    const Expr& callee = *e.items[0];
    if (callee.kind == Expr::Kind::kAttr) {
      Value obj = Eval(*callee.items[0]);
      if (obj.kind() == Value::Kind::kNamespace) {
        Value attr = obj.Item(callee.name);
        if (attr.kind() == Value::Kind::kMacro) return CallMacro(*attr.macro(), EvalArgs(e));
      }
      bool found = false;
      Value result = CallMethod(obj, callee.name, EvalArgs(e), &found);
      if (!found) {
        throw RenderError(absl::StrCat("'", TypeName(obj), "' has no method '", callee.name, "'"));
      }
      return result;
    }
    if (callee.kind == Expr::Kind::kName) {
      Value f = Lookup(callee.name);
      if (f.kind() == Value::Kind::kMacro) return CallMacro(*f.macro(), EvalArgs(e));
      if (f.undefined()) return CallGlobal(callee.name, EvalArgs(e));
      throw RenderError(absl::StrCat("'", callee.name, "' is not callable"));
    }
    Value f = Eval(callee);
    if (f.kind() == Value::Kind::kMacro) return CallMacro(*f.macro(), EvalArgs(e));
    throw RenderError(absl::StrCat("'", TypeName(f), "' is not callable"));
  }

  Value Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return Value(e.value);
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList: {
        Json list = Json::array();
        for (const ExprPtr& item : e.items) list.push_back(ToJsonValue(Eval(*item)));
        return Value(std::move(list));
      }
      case Expr::Kind::kDict: {
        Json dict = Json::object();
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          Value key = Eval(*e.items[i]);
          dict[key.is_json() && key.json().is_string() ? key.json().get<std::string>()
                                                       : ToString(key)] =
              ToJsonValue(Eval(*e.items[i + 1]));
        }
        return Value(std::move(dict));
      }
      case Expr::Kind::kAttr:
        return Eval(*e.items[0]).Item(e.name);
      case Expr::Kind::kIndex: {
        Value obj = Eval(*e.items[0]);
        Value key = Eval(*e.items[1]);
        return key.is_json() ? obj.Item(key.json()) : Value();
      }
      case Expr::Kind::kSlice: {
        auto part = [&](int i) { return e.items[i] ? Eval(*e.items[i]) : Value(); };
        return Slice(Eval(*e.items[0]), part(1), part(2), part(3));
      }
      case Expr::Kind::kCall:
        return Call(e);
      case Expr::Kind::kFilter:
        return ApplyFilter(e.name, Eval(*e.items[0]), EvalArgs(e));
      case Expr::Kind::kTest: {
        if (!IsTest(e.name)) throw RenderError(absl::StrCat("unknown test '", e.name, "'"));
        const bool result = ApplyTest(e.name, Eval(*e.items[0]), EvalArgs(e));
        return Value(Json(result != e.negated));
      }
      case Expr::Kind::kUnary: {
        Value v = Eval(*e.items[0]);
        if (e.name == "not") return Value(Json(!Truthy(v)));
        if (!IsNumber(v)) {
          throw RenderError(
              absl::StrCat("bad operand type for unary ", e.name, ": '", TypeName(v), "'"));
        }
        if (e.name == "+") return v;
        const Json& j = v.json();
        return j.is_number_integer() ? Value(Json(-j.get<int64_t>()))
                                     : Value(Json(-j.get<double>()));
      }
      case Expr::Kind::kBinary: {
        Value a = Eval(*e.items[0]);
        const std::string& op = e.name;
        if (op == "and") return Truthy(a) ? Eval(*e.items[1]) : a;
        if (op == "or") return Truthy(a) ? a : Eval(*e.items[1]);
        Value b = Eval(*e.items[1]);
        if (op == "~") return Value(Json(ToString(a) + ToString(b)));
        if (op == "==") return Value(Json(Equal(a, b)));
        if (op == "!=") return Value(Json(!Equal(a, b)));
        if (op == "<") return Value(Json(Compare(a, b) < 0));
        if (op == ">") return Value(Json(Compare(a, b) > 0));
        if (op == "<=") return Value(Json(Compare(a, b) <= 0));
        if (op == ">=") return Value(Json(Compare(a, b) >= 0));
        if (op == "in") return Value(Json(Contains(b, a)));
        if (op == "not in") return Value(Json(!Contains(b, a)));
        return Arithmetic(op, a, b);
      }
      case Expr::Kind::kCond:
        if (Truthy(Eval(*e.items[0]))) return Eval(*e.items[1]);
        return e.items[2] ? Eval(*e.items[2]) : Value();
    }
    return Value();
  }

  std::shared_ptr<const Json> context_;
  std::vector<Frame> frames_;  // [0]: the template's top-level variables
  std::string out_;
  int macro_depth_ = 0;
};

}  // namespace
}  // namespace jinja

absl::StatusOr<JinjaTemplate> JinjaTemplate::Parse(const std::string& source) {
  try {
    JinjaTemplate t;
    t.root_ = jinja::ParseTemplate(source);
    return t;
  } catch (const jinja::ParseError& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("line ", e.line, ", column ", e.column, ": ", e.what()));
  }
}

absl::StatusOr<std::string> JinjaTemplate::Render(const TemplateJson& context) const {
  if (!context.is_object()) return absl::InvalidArgumentError("template context is not an object");
  try {
    return jinja::Renderer(context).Run(*root_);
  } catch (const jinja::RenderError& e) {
    return absl::InvalidArgumentError(e.what());
  } catch (const std::exception& e) {  // nlohmann or std::sto* on odd data: still the input's fault
    return absl::InvalidArgumentError(absl::StrCat("template: ", e.what()));
  }
}

}  // namespace moe::engine
