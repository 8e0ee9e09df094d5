// Internals of JinjaTemplate: the syntax tree, the runtime value and the error types shared by
// jinja_lex.cc, jinja_parse.cc, jinja_value.cc, jinja_render.cc and jinja_builtins.cc.
#pragma once

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/tokenizer/jinja.h"

namespace moe::engine::jinja {

using Json = TemplateJson;

// A template that does not parse; line and column are 1-based (columns count characters).
struct ParseError : std::runtime_error {
  ParseError(int l, int c, const std::string& what)
      : std::runtime_error(what), line(l), column(c) {}
  int line, column;
};
// Anything that stops a render: raise_exception, wrong types, limits.
struct RenderError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Pos {
  int line = 1, column = 1;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kList,     // items
    kDict,     // items: key, value, key, value...
    kAttr,     // items[0].name
    kIndex,    // items[0][items[1]]
    kSlice,    // items[0][items[1]:items[2]:items[3]], absent parts null
    kCall,     // items[0](args, kwargs)
    kFilter,   // items[0] | name(args, kwargs)
    kTest,     // items[0] is [not] name(args)
    kUnary,    // name ("-", "+", "not") items[0]
    kBinary,   // items[0] name items[1]; name is the operator, "and"/"or" short-circuit
    kCond,     // items[1] if items[0] else items[2] (items[2] may be null: undefined)
  };
  Kind kind;
  Pos pos;
  Json value;
  std::string name;
  std::vector<ExprPtr> items;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // kTest: "is not"
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    kBody,    // body (the template root, a generation block)
    kText,    // text
    kOutput,  // {{ expr }}
    kIf,      // branches: (condition or null for else, body)
    kFor,     // for targets in expr [if filter]: body [else: else_body]
    kSet,     // set targets[0] = expr, or set targets[0].attr = expr; block set: body
    kMacro,   // macro targets[0](params): body
    kBreak,
    kContinue,
  };
  Kind kind;
  Pos pos;
  std::string text;
  ExprPtr expr, filter;
  std::vector<std::string> targets;
  std::string attr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro: name, default or null
  Body body, else_body;
  bool block_set = false;
};

// --- lexing (jinja_lex.cc) ---

// A piece of template source: text, or a tag with its inner source and whitespace markers.
struct Piece {
  enum class Kind { kText, kVariable, kBlock } kind;
  Pos pos;             // of the text, or of the tag's "{"
  std::string source;  // the text (whitespace control applied), or the tag's inner source
  Pos inner;           // position of `source` for tags
};
// Splits `source` into pieces, dropping comments, applying `-`/`+` markers, trim_blocks and
// lstrip_blocks, and turning {% raw %}...{% endraw %} into text. Throws ParseError.
std::vector<Piece> SplitTemplate(const std::string& source);

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind;
  Pos pos;
  std::string text;  // name, operator, or the unescaped string
  Json number;
};
// Tokens of one tag's inner source, ending with kEnd. Throws ParseError.
std::vector<Token> TokenizeExpression(const std::string& source, Pos start);

// --- parsing (jinja_parse.cc) ---
std::unique_ptr<Node> ParseTemplate(const std::string& source);

// --- values (jinja_value.cc) ---

struct Namespace;
// A runtime value: undefined, JSON (a node inside a shared immutable tree, so attribute access and
// iteration copy nothing), a namespace (mutable attributes), or a macro.
class Value {
 public:
  enum class Kind { kUndefined, kJson, kNamespace, kMacro };

  Value() = default;  // undefined
  explicit Value(Json json);
  static Value Ref(std::shared_ptr<const Json> root, const Json* node);
  static Value OfNamespace(std::shared_ptr<Namespace> ns);
  static Value OfMacro(const Node* macro);

  Kind kind() const { return kind_; }
  bool undefined() const { return kind_ == Kind::kUndefined; }
  bool is_json() const { return kind_ == Kind::kJson; }
  // Requires is_json().
  const Json& json() const { return *node_; }
  Namespace* ns() const { return ns_.get(); }
  const Node* macro() const { return macro_; }

  // x.name / x[key] for JSON objects and arrays (negative indexes count from the end); undefined
  // when absent. Namespaces give their attribute.
  Value Item(const Json& key) const;
  Value Item(const std::string& key) const { return Item(Json(key)); }

  // The elements `for` visits: array elements, object keys, string characters. Undefined is
  // empty; anything else is a RenderError.
  std::vector<Value> Iterate() const;

 private:
  Kind kind_ = Kind::kUndefined;
  std::shared_ptr<const Json> root_;
  const Json* node_ = nullptr;
  std::shared_ptr<Namespace> ns_;
  const Node* macro_ = nullptr;
};

struct Namespace {
  std::map<std::string, Value> attrs;
};

bool Truthy(const Value& v);
// Python str(): strings as is, None/True/False, 1.0, lists and dicts as Python reprs.
std::string ToString(const Value& v);
// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=indent); indent < 0 is none.
std::string ToJson(const Json& j, int indent);
// The value as JSON for building lists/dicts and for filters; undefined becomes null.
Json ToJsonValue(const Value& v);
bool Equal(const Value& a, const Value& b);
// <0, 0, >0 for numbers, strings and lists; RenderError otherwise.
int Compare(const Value& a, const Value& b);
std::string TypeName(const Value& v);

// --- builtins (jinja_builtins.cc) ---
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
  // The i-th positional argument or the named one; undefined when absent.
  Value Get(size_t i, const char* name) const;
};
Value ApplyFilter(const std::string& name, const Value& input, const Args& args);
bool ApplyTest(const std::string& name, const Value& input, const Args& args);
// obj.name(args) for string and dict methods; sets *found false when `name` is not a method.
Value CallMethod(const Value& obj, const std::string& name, const Args& args, bool* found);
bool IsTest(const std::string& name);
// Whether ApplyFilter knows `name`; the parser refuses others, as Jinja2 does at compile time.
bool IsFilter(const std::string& name);

}  // namespace moe::engine::jinja
