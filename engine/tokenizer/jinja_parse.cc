// Jinja parsing: pieces -> statement tree, tag tokens -> expressions (Jinja2's precedence).
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/jinja_ast.h"

namespace moe::engine::jinja {
namespace {

constexpr int kMaxDepth =
    200;  // nesting of expressions and blocks; deeper is an error, not a crash

[[noreturn]] void Fail(Pos pos, const std::string& what) {
  throw ParseError(pos.line, pos.column, what);
}

ExprPtr MakeExpr(Expr::Kind kind, Pos pos) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  return e;
}

// Recursive descent over one tag's tokens. Precedence, loosest first (as Jinja2):
//   a if c else b;  or;  and;  not;  comparisons and in;  + -;  ~;  * / // %;  **;  unary - +;
//   primary with .attr [index] (call) and then | filter / is test.
class ExprParser {
 public:
  explicit ExprParser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  const Token& Peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  bool AtEnd() const { return Peek().kind == Token::Kind::kEnd; }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).kind == Token::Kind::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).kind == Token::Kind::kName && Peek(ahead).text == name;
  }
  const Token& Next() { return t_[std::min(i_++, t_.size() - 1)]; }
  void Expect(const char* op) {
    if (!IsOp(op)) Fail(Peek().pos, absl::StrCat("expected '", op, "', found ", Describe(Peek())));
    ++i_;
  }
  std::string ExpectName() {
    if (Peek().kind != Token::Kind::kName) {
      Fail(Peek().pos, absl::StrCat("expected a name, found ", Describe(Peek())));
    }
    return Next().text;
  }
  void ExpectEnd() {
    if (!AtEnd()) Fail(Peek().pos, absl::StrCat("unexpected ", Describe(Peek())));
  }
  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case Token::Kind::kEnd:
        return "the end of the tag";
      case Token::Kind::kString:
        return "a string";
      default:
        return absl::StrCat("'", t.text, "'");
    }
  }

  ExprPtr Expression() {
    Depth guard(this);
    ExprPtr e = Or();
    while (IsName("if")) {
      const Pos pos = Next().pos;
      auto cond = MakeExpr(Expr::Kind::kCond, pos);
      ExprPtr test = Or();
      ExprPtr otherwise;
      if (IsName("else")) {
        ++i_;
        otherwise = Expression();
      }
      cond->items.push_back(std::move(test));
      cond->items.push_back(std::move(e));
      cond->items.push_back(std::move(otherwise));
      e = std::move(cond);
    }
    return e;
  }

  // An expression without a ternary: the iterable of `for x in y if c`, where `if` filters.
  ExprPtr OrExpression() { return Or(); }

 private:
  struct Depth {
    explicit Depth(ExprParser* p) : p_(p) {
      if (++p_->depth_ > kMaxDepth) Fail(p_->Peek().pos, "expression nested too deeply");
    }
    ~Depth() { --p_->depth_; }
    ExprParser* p_;
  };

  ExprPtr Binary(const std::string& op, Pos pos, ExprPtr a, ExprPtr b) {
    auto e = MakeExpr(Expr::Kind::kBinary, pos);
    e->name = op;
    e->items.push_back(std::move(a));
    e->items.push_back(std::move(b));
    return e;
  }

  ExprPtr Or() {
    ExprPtr e = And();
    while (IsName("or")) {
      const Pos pos = Next().pos;
      e = Binary("or", pos, std::move(e), And());
    }
    return e;
  }
  ExprPtr And() {
    ExprPtr e = Not();
    while (IsName("and")) {
      const Pos pos = Next().pos;
      e = Binary("and", pos, std::move(e), Not());
    }
    return e;
  }
  ExprPtr Not() {
    if (IsName("not")) {
      Depth guard(this);
      auto e = MakeExpr(Expr::Kind::kUnary, Next().pos);
      e->name = "not";
      e->items.push_back(Not());
      return e;
    }
    return Compare();
  }
  ExprPtr Compare() {
    ExprPtr e = Add();
    while (true) {
      const Token& t = Peek();
      if (t.kind == Token::Kind::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                         t.text == ">" || t.text == "<=" || t.text == ">=")) {
        const std::string op = Next().text;
        e = Binary(op, t.pos, std::move(e), Add());
      } else if (IsName("in")) {
        const Pos pos = Next().pos;
        e = Binary("in", pos, std::move(e), Add());
      } else if (IsName("not") && IsName("in", 1)) {
        const Pos pos = Next().pos;
        ++i_;
        e = Binary("not in", pos, std::move(e), Add());
      } else {
        return e;
      }
    }
  }
  ExprPtr Add() {
    ExprPtr e = Concat();
    while (IsOp("+") || IsOp("-")) {
      const Token& t = Next();
      e = Binary(t.text, t.pos, std::move(e), Concat());
    }
    return e;
  }
  ExprPtr Concat() {
    ExprPtr e = Mul();
    while (IsOp("~")) {
      const Pos pos = Next().pos;
      e = Binary("~", pos, std::move(e), Mul());
    }
    return e;
  }
  ExprPtr Mul() {
    ExprPtr e = Pow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& t = Next();
      e = Binary(t.text, t.pos, std::move(e), Pow());
    }
    return e;
  }
  ExprPtr Pow() {
    ExprPtr e = Unary();
    while (IsOp("**")) {
      const Pos pos = Next().pos;
      e = Binary("**", pos, std::move(e), Unary());
    }
    return e;
  }
  ExprPtr Unary() {
    Depth guard(this);
    if (IsOp("-") || IsOp("+")) {
      const Token& t = Next();
      auto e = MakeExpr(Expr::Kind::kUnary, t.pos);
      e->name = t.text;
      e->items.push_back(Unary());
      return FiltersAndTests(std::move(e));
    }
    return FiltersAndTests(Postfix(Primary()));
  }

  ExprPtr Primary() {
    const Token& t = Peek();
    switch (t.kind) {
      case Token::Kind::kName: {
        ++i_;
        static const std::pair<const char*, Json> kConstants[] = {
            {"true", true},   {"True", true},    {"false", false},
            {"False", false}, {"none", nullptr}, {"None", nullptr}};
        for (const auto& [name, value] : kConstants) {
          if (t.text == name) {
            auto e = MakeExpr(Expr::Kind::kLiteral, t.pos);
            e->value = value;
            return e;
          }
        }
        auto e = MakeExpr(Expr::Kind::kName, t.pos);
        e->name = t.text;
        return e;
      }
      case Token::Kind::kString: {
        auto e = MakeExpr(Expr::Kind::kLiteral, t.pos);
        std::string s;
        while (Peek().kind == Token::Kind::kString) s += Next().text;  // "a" "b" is "ab"
        e->value = s;
        return e;
      }
      case Token::Kind::kInt:
      case Token::Kind::kFloat: {
        auto e = MakeExpr(Expr::Kind::kLiteral, t.pos);
        e->value = Next().number;
        return e;
      }
      case Token::Kind::kOp:
        if (t.text == "(") {
          ++i_;
          if (IsOp(")")) {  // () is an empty tuple
            ++i_;
            return MakeExpr(Expr::Kind::kList, t.pos);
          }
          ExprPtr e = Expression();
          if (IsOp(",")) {  // a tuple: evaluated as a list
            auto list = MakeExpr(Expr::Kind::kList, t.pos);
            list->items.push_back(std::move(e));
            while (IsOp(",")) {
              ++i_;
              if (IsOp(")")) break;
              list->items.push_back(Expression());
            }
            e = std::move(list);
          }
          Expect(")");
          return e;
        }
        if (t.text == "[") {
          ++i_;
          auto e = MakeExpr(Expr::Kind::kList, t.pos);
          while (!IsOp("]")) {
            e->items.push_back(Expression());
            if (!IsOp(",")) break;
            ++i_;
          }
          Expect("]");
          return e;
        }
        if (t.text == "{") {
          ++i_;
          auto e = MakeExpr(Expr::Kind::kDict, t.pos);
          while (!IsOp("}")) {
            e->items.push_back(Expression());
            Expect(":");
            e->items.push_back(Expression());
            if (!IsOp(",")) break;
            ++i_;
          }
          Expect("}");
          return e;
        }
        break;
      case Token::Kind::kEnd:
        break;
    }
    Fail(t.pos, absl::StrCat("expected an expression, found ", Describe(t)));
  }

  // Arguments of a call, filter or test after "(": positional, then name=value.
  void CallArgs(Expr* e) {
    Expect("(");
    while (!IsOp(")")) {
      if (Peek().kind == Token::Kind::kName && IsOp("=", 1)) {
        std::string name = Next().text;
        ++i_;
        e->kwargs.emplace_back(std::move(name), Expression());
      } else {
        if (!e->kwargs.empty()) Fail(Peek().pos, "positional argument after a keyword argument");
        e->args.push_back(Expression());
      }
      if (!IsOp(",")) break;
      ++i_;
    }
    Expect(")");
  }

  ExprPtr Postfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        const Pos pos = Next().pos;
        auto attr = MakeExpr(Expr::Kind::kAttr, pos);
        if (Peek().kind == Token::Kind::kInt) {  // x.0 is x[0]
          attr->kind = Expr::Kind::kIndex;
          attr->items.push_back(std::move(e));
          auto index = MakeExpr(Expr::Kind::kLiteral, Peek().pos);
          index->value = Next().number;
          attr->items.push_back(std::move(index));
        } else {
          attr->name = ExpectName();
          attr->items.push_back(std::move(e));
        }
        e = std::move(attr);
      } else if (IsOp("[")) {
        const Pos pos = Next().pos;
        ExprPtr parts[3];
        int n = 0;
        bool slice = false;
        while (true) {
          if (!IsOp(":") && !IsOp("]")) parts[n] = Expression();
          if (IsOp(":") && n < 2) {
            ++i_;
            ++n;
            slice = true;
            continue;
          }
          break;
        }
        Expect("]");
        auto index = MakeExpr(slice ? Expr::Kind::kSlice : Expr::Kind::kIndex, pos);
        index->items.push_back(std::move(e));
        if (!slice && !parts[0]) Fail(pos, "empty subscript");
        for (int k = 0; k < (slice ? 3 : 1); ++k) index->items.push_back(std::move(parts[k]));
        e = std::move(index);
      } else if (IsOp("(")) {
        auto call = MakeExpr(Expr::Kind::kCall, Peek().pos);
        call->items.push_back(std::move(e));
        CallArgs(call.get());
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  ExprPtr FiltersAndTests(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        ++i_;
        auto f = MakeExpr(Expr::Kind::kFilter, Peek().pos);
        const Pos name_pos = Peek().pos;
        f->name = ExpectName();
        if (!IsFilter(f->name)) Fail(name_pos, absl::StrCat("unknown filter '", f->name, "'"));
        f->items.push_back(std::move(e));
        if (IsOp("(")) CallArgs(f.get());
        e = Postfix(std::move(f));
      } else if (IsName("is")) {
        ++i_;
        auto test = MakeExpr(Expr::Kind::kTest, Peek().pos);
        if (IsName("not")) {
          ++i_;
          test->negated = true;
        }
        const Pos name_pos = Peek().pos;
        test->name = ExpectName();
        if (!IsTest(test->name)) Fail(name_pos, absl::StrCat("unknown test '", test->name, "'"));
        test->items.push_back(std::move(e));
        if (IsOp("(")) {
          CallArgs(test.get());
        } else if (StartsArgument()) {  // `is equalto 3`, `is sameas false`
          test->args.push_back(Postfix(Primary()));
        }
        e = std::move(test);
      } else {
        return e;
      }
    }
  }

  bool StartsArgument() const {
    const Token& t = Peek();
    if (t.kind == Token::Kind::kName) {
      return t.text != "else" && t.text != "or" && t.text != "and" && t.text != "if" &&
             t.text != "in" && t.text != "is" && t.text != "not";
    }
    return t.kind == Token::Kind::kString || t.kind == Token::Kind::kInt ||
           t.kind == Token::Kind::kFloat ||
           (t.kind == Token::Kind::kOp && (t.text == "[" || t.text == "{"));
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

std::unique_ptr<Node> MakeNode(Node::Kind kind, Pos pos) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->pos = pos;
  return n;
}

// Statements over the piece list. Each block tag is tokenized when reached; the tag that ends a
// body (endif, else, ...) is left in `tag_` for the caller that expects it.
class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  std::unique_ptr<Node> Parse() {
    auto root = MakeNode(Node::Kind::kBody, Pos{});
    root->body = ParseBody({}, "", Pos{});
    return root;
  }

 private:
  // Parses until a block tag whose keyword is in `ends` (left in tag_/keyword_). `opener` names the
  // statement being closed, for the error when the template ends first.
  Body ParseBody(std::initializer_list<const char*> ends, const char* opener, Pos opened) {
    if (++depth_ > kMaxDepth) Fail(opened, "blocks nested too deeply");
    Body body;
    while (at_ < pieces_.size()) {
      Piece& p = pieces_[at_++];
      if (p.kind == Piece::Kind::kText) {
        auto n = MakeNode(Node::Kind::kText, p.pos);
        n->text = std::move(p.source);
        body.push_back(std::move(n));
        continue;
      }
      tag_ = std::make_unique<ExprParser>(TokenizeExpression(p.source, p.inner));
      if (p.kind == Piece::Kind::kVariable) {
        auto n = MakeNode(Node::Kind::kOutput, p.pos);
        if (tag_->AtEnd()) Fail(p.pos, "empty expression");
        n->expr = tag_->Expression();
        tag_->ExpectEnd();
        body.push_back(std::move(n));
        continue;
      }
      if (tag_->Peek().kind != Token::Kind::kName) Fail(p.pos, "expected a statement name");
      keyword_ = tag_->Next().text;
      tag_pos_ = p.pos;
      for (const char* end : ends) {
        if (keyword_ == end) {
          --depth_;
          return body;
        }
      }
      body.push_back(Statement());
    }
    if (ends.size() > 0) {
      Fail(opened,
           absl::StrCat("'", opener, "' is never closed (expected '", *(ends.end() - 1), "')"));
    }
    --depth_;
    return body;
  }

  std::unique_ptr<Node> Statement() {
    const Pos pos = tag_pos_;
    if (keyword_ == "if") {
      auto n = MakeNode(Node::Kind::kIf, pos);
      ExprPtr cond = tag_->Expression();
      tag_->ExpectEnd();
      while (true) {
        Body body = ParseBody({"elif", "else", "endif"}, "if", pos);
        n->branches.emplace_back(std::move(cond), std::move(body));
        if (keyword_ == "endif") break;
        if (keyword_ == "else") {
          tag_->ExpectEnd();
          n->branches.emplace_back(nullptr, ParseBody({"endif"}, "if", pos));
          break;
        }
        cond = tag_->Expression();  // elif
        tag_->ExpectEnd();
      }
      tag_->ExpectEnd();
      return n;
    }
    if (keyword_ == "for") {
      auto n = MakeNode(Node::Kind::kFor, pos);
      n->targets.push_back(tag_->ExpectName());
      while (tag_->IsOp(",")) {
        tag_->Next();
        n->targets.push_back(tag_->ExpectName());
      }
      if (!tag_->IsName("in")) Fail(tag_->Peek().pos, "expected 'in' in the for statement");
      tag_->Next();
      n->expr = tag_->OrExpression();
      if (tag_->IsName("if")) {
        tag_->Next();
        n->filter = tag_->Expression();
      }
      if (tag_->IsName("recursive")) Fail(tag_->Peek().pos, "recursive loops are not supported");
      tag_->ExpectEnd();
      n->body = ParseBody({"else", "endfor"}, "for", pos);
      if (keyword_ == "else") {
        tag_->ExpectEnd();
        n->else_body = ParseBody({"endfor"}, "for", pos);
      }
      tag_->ExpectEnd();
      return n;
    }
    if (keyword_ == "set") {
      auto n = MakeNode(Node::Kind::kSet, pos);
      n->targets.push_back(tag_->ExpectName());
      if (tag_->IsOp(".")) {
        tag_->Next();
        n->attr = tag_->ExpectName();
      }
      if (tag_->IsOp("=")) {
        tag_->Next();
        n->expr = tag_->Expression();
        tag_->ExpectEnd();
        return n;
      }
      tag_->ExpectEnd();  // {% set x %}...{% endset %}
      n->block_set = true;
      n->body = ParseBody({"endset"}, "set", pos);
      tag_->ExpectEnd();
      return n;
    }
    if (keyword_ == "macro") {
      auto n = MakeNode(Node::Kind::kMacro, pos);
      n->targets.push_back(tag_->ExpectName());
      tag_->Expect("(");
      while (!tag_->IsOp(")")) {
        std::string name = tag_->ExpectName();
        ExprPtr fallback;
        if (tag_->IsOp("=")) {
          tag_->Next();
          fallback = tag_->Expression();
        }
        n->params.emplace_back(std::move(name), std::move(fallback));
        if (!tag_->IsOp(",")) break;
        tag_->Next();
      }
      tag_->Expect(")");
      tag_->ExpectEnd();
      n->body = ParseBody({"endmacro"}, "macro", pos);
      tag_->ExpectEnd();
      return n;
    }
    if (keyword_ == "break" || keyword_ == "continue") {
      tag_->ExpectEnd();
      return MakeNode(keyword_ == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, pos);
    }
    if (keyword_ == "generation") {  // transformers' assistant-mask marker: renders its body
      tag_->ExpectEnd();
      auto n = MakeNode(Node::Kind::kBody, pos);
      n->body = ParseBody({"endgeneration"}, "generation", pos);
      tag_->ExpectEnd();
      return n;
    }
    static const char* kEnds[] = {"elif",   "else",     "endif",        "endfor",
                                  "endset", "endmacro", "endgeneration"};
    for (const char* end : kEnds) {
      if (keyword_ == end) Fail(pos, absl::StrCat("unexpected '", keyword_, "'"));
    }
    Fail(pos, absl::StrCat("unknown statement '", keyword_, "'"));
  }

  std::vector<Piece> pieces_;
  size_t at_ = 0;
  int depth_ = 0;
  std::unique_ptr<ExprParser> tag_;
  std::string keyword_;
  Pos tag_pos_;
};

}  // namespace

std::unique_ptr<Node> ParseTemplate(const std::string& source) {
  return TemplateParser(SplitTemplate(source)).Parse();
}

}  // namespace moe::engine::jinja
