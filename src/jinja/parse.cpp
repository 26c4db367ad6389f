// Jinja2's parser for the chat-template subset (jinja.h) over the tokens of
// lex.h. The operator precedence is Jinja2's (parser.py): condexpr < or < and
// < not < compare < + - < ~ < * / // % < ** < unary - + < primary with
// postfix . [] () and then filters and tests. Nesting, of tags and of
// expressions (chains included), is bounded so that parsing, rendering and
// freeing the tree never outrun the stack.
#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "jinja/ast.h"
#include "jinja/lex.h"

namespace encore::jinja::detail {

namespace {

constexpr int kMaxParseDepth = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse() {
    std::string end;
    Body body = parse_body({}, &end);
    return body;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool is_op(std::string_view op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(std::string_view n) const { return cur().type == Tok::Name && cur().text == n; }
  int line() const { return cur().line; }
  Token next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }

  [[noreturn]] void unexpected(std::string_view wanted) const {
    const Token& t = cur();
    std::string got = t.type == Tok::End        ? "end of template"
                      : t.type == Tok::BlockEnd ? "'%}'"
                      : t.type == Tok::VarEnd   ? "'}}'"
                      : t.type == Tok::Data     ? "text"
                                                : "'" + t.text + "'";
    fail_at(t.line, fmt::format("expected {}, got {}", wanted, got));
  }
  void expect_op(std::string_view op) {
    if (!is_op(op)) unexpected(fmt::format("'{}'", op));
    ++i_;
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) unexpected("a name");
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) unexpected("'%}'");
    ++i_;
  }

  struct Depth {
    explicit Depth(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxParseDepth) fail_at(p_.line(), "template nested too deeply");
    }
    ~Depth() { --p_.depth_; }
    Parser& p_;
  };
  // A left-associative chain (a + b + c, x|f|g, x.a[0](), t if c if d)
  // builds its tree in a loop, one level per link, and rendering and freeing
  // it recurse through every level: each link counts as one level of nesting
  // until the chain's function returns, so no tree grows deeper than
  // kMaxParseDepth whatever the template's size.
  struct Chain {
    explicit Chain(Parser& p) : p_(p) {}
    void link() {
      ++links_;
      if (++p_.depth_ > kMaxParseDepth) fail_at(p_.line(), "template nested too deeply");
    }
    ~Chain() { p_.depth_ -= links_; }
    Parser& p_;
    int links_ = 0;
  };

  // Statements until a block tag named in `ends` (left unconsumed after its
  // name: *end_name says which) or the end of the template (only when `ends`
  // is empty).
  Body parse_body(const std::vector<std::string_view>& ends, std::string* end_name) {
    Depth depth(*this);
    Body body;
    for (;;) {
      const Token& t = cur();
      if (t.type == Tok::End) {
        if (!ends.empty()) {
          // Name the closing tag ({% endif %}), not an alternative ({% elif %}).
          std::string_view want = ends[0];
          for (std::string_view e : ends) {
            if (e.rfind("end", 0) == 0) want = e;
          }
          fail_at(t.line, fmt::format("unexpected end of template: missing {{% {} %}}", want));
        }
        return body;
      }
      if (t.type == Tok::Data) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Text;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        ++i_;
      } else if (t.type == Tok::VarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Print;
        s->line = t.line;
        ++i_;
        s->expr = parse_tuple(true);
        if (cur().type != Tok::VarEnd) unexpected("'}}'");
        ++i_;
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        ++i_;
        if (cur().type != Tok::Name) unexpected("a statement name");
        const std::string& name = cur().text;
        for (std::string_view e : ends) {
          if (name == e) {
            *end_name = name;
            ++i_;
            return body;
          }
        }
        body.push_back(parse_statement());
      } else {
        unexpected("text or a tag");
      }
    }
  }

  std::unique_ptr<Stmt> parse_statement() {
    const int ln = line();
    const std::string name = next().text;
    auto s = std::make_unique<Stmt>();
    s->line = ln;
    std::string end;
    // jinja2 refuses an unknown filter or test when it compiles the
    // template, except in an `if` (its test and bodies, not inside a nested
    // for, macro or block), where the error waits until it runs.
    const bool soft = soft_;
    struct Restore {
      bool& flag;
      bool saved;
      ~Restore() { flag = saved; }
    } restore{soft_, soft};
    if (name == "if") {
      soft_ = true;
    } else if (name == "for" || name == "macro" || name == "call" || name == "filter" ||
               name == "with") {
      soft_ = false;
    }
    if (name == "if") {
      s->kind = StmtKind::If;
      ExprPtr cond = parse_tuple(false);
      for (;;) {
        expect_block_end();
        Body body = parse_body({"elif", "else", "endif"}, &end);
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (end == "elif") {
          cond = parse_tuple(false);
          continue;
        }
        if (end == "else") {
          expect_block_end();
          s->branches.emplace_back(nullptr, parse_body({"endif"}, &end));
        }
        break;
      }
    } else if (name == "for") {
      s->kind = StmtKind::For;
      s->targets = parse_targets();
      if (!is_name("in")) unexpected("'in'");
      ++i_;
      s->expr = parse_tuple(false, true);
      if (is_name("if")) {
        ++i_;
        s->cond = parse_expression(true);
      }
      if (is_name("recursive")) fail_at(ln, "recursive for loops are not supported");
      expect_block_end();
      ++loop_depth_;
      s->body = parse_body({"endfor", "else"}, &end);
      --loop_depth_;
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, &end);
      }
    } else if (name == "set") {
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == ".") {
        s->kind = StmtKind::Set;
        s->targets.push_back(next().text);
        ++i_;
        s->attr = expect_name();
        expect_op("=");
        s->expr = parse_tuple(true);
      } else {
        s->targets = parse_targets();
        if (is_op("=")) {
          ++i_;
          s->kind = StmtKind::Set;
          s->expr = parse_tuple(true);
        } else {
          if (s->targets.size() != 1) unexpected("'='");
          s->kind = StmtKind::SetBlock;
          soft_ = false;
          if (is_op("|")) s->expr = parse_filters(nullptr);
          expect_block_end();
          s->body = parse_body({"endset"}, &end);
        }
      }
    } else if (name == "macro") {
      s->kind = StmtKind::Macro;
      s->name = expect_name();
      parse_params(*s);
      expect_block_end();
      const int loops = std::exchange(loop_depth_, 0);  // a macro body is a function of its own
      const auto reads = std::exchange(reads_, {});
      s->body = parse_body({"endmacro"}, &end);
      s->catch_varargs = reads_.varargs;
      s->catch_kwargs = reads_.kwargs;
      // jinja2 counts a nested macro's reads for the outer one too.
      reads_ = {reads.varargs || reads_.varargs, reads.kwargs || reads_.kwargs};
      loop_depth_ = loops;
      if (cur().type == Tok::Name && cur().text == s->name) ++i_;
    } else if (name == "call") {
      s->kind = StmtKind::CallBlock;
      if (is_op("(")) parse_params(*s);
      s->expr = parse_expression(true);
      if (s->expr->kind != ExprKind::Call) fail_at(ln, "{% call %} needs a macro call");
      expect_block_end();
      const int loops = std::exchange(loop_depth_, 0);  // so is the caller's
      const auto reads = std::exchange(reads_, {});
      s->body = parse_body({"endcall"}, &end);
      s->catch_varargs = reads_.varargs;
      s->catch_kwargs = reads_.kwargs;
      // jinja2 counts a nested macro's reads for the outer one too.
      reads_ = {reads.varargs || reads_.varargs, reads.kwargs || reads_.kwargs};
      loop_depth_ = loops;
    } else if (name == "filter") {
      s->kind = StmtKind::FilterBlock;
      s->expr = parse_filters(nullptr, true);
      expect_block_end();
      s->body = parse_body({"endfilter"}, &end);
    } else if (name == "with") {
      s->kind = StmtKind::With;
      while (cur().type != Tok::BlockEnd) {
        if (!s->params.empty()) expect_op(",");
        std::string target = expect_name();
        expect_op("=");
        s->params.emplace_back(std::move(target), parse_expression(true));
      }
      expect_block_end();
      s->body = parse_body({"endwith"}, &end);
    } else if (name == "break" || name == "continue") {
      s->kind = name == "break" ? StmtKind::Break : StmtKind::Continue;
      if (loop_depth_ == 0) fail_at(ln, fmt::format("'{}' outside loop", name));
    } else if (name == "generation") {
      s->kind = StmtKind::Generation;
      expect_block_end();
      s->body = parse_body({"endgeneration"}, &end);
    } else if (name.rfind("end", 0) == 0 || name == "else" || name == "elif") {
      fail_at(ln, fmt::format("unexpected '{{% {} %}}': no open block takes it", name));
    } else {
      fail_at(ln, fmt::format("the statement '{}' is not supported in chat templates", name));
    }
    expect_block_end();
    return s;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> targets;
    const bool paren = is_op("(");
    if (paren) ++i_;
    targets.push_back(expect_name());
    while (is_op(",")) {
      ++i_;
      if (is_op("(")) fail_at(line(), "nested tuple targets (a, (b, c)) are not supported");
      if (cur().type != Tok::Name) break;
      targets.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return targets;
  }

  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      const int ln = line();
      std::string n = expect_name();
      for (const auto& [other, d] : s.params) {
        if (other == n) fail_at(ln, fmt::format("duplicate argument '{}'", n));
      }
      ExprPtr def;
      if (is_op("=")) {
        ++i_;
        def = parse_expression(true);
      } else if (!s.params.empty() && s.params.back().second) {
        fail_at(ln, "non-default argument follows default argument");
      }
      s.params.emplace_back(std::move(n), std::move(def));
    }
    ++i_;
  }

  ExprPtr make(ExprKind k, int ln) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = ln;
    return e;
  }

  // Expressions separated by commas form a tuple (no parentheses needed).
  ExprPtr parse_tuple(bool with_condexpr, bool for_iter = false) {
    const int ln = line();
    std::vector<ExprPtr> items;
    bool trailing = false;
    for (;;) {
      if (!items.empty()) {
        if (!is_op(",")) break;
        ++i_;
        trailing = true;
      }
      if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || is_op(")") ||
          (for_iter && (is_name("if") || is_name("recursive")))) {
        break;
      }
      items.push_back(parse_expression(with_condexpr));
      trailing = false;
    }
    if (items.empty()) unexpected("an expression");
    if (items.size() == 1 && !trailing) return std::move(items[0]);
    auto e = make(ExprKind::Tuple, ln);
    e->items = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Depth depth(*this);
    if (!with_condexpr) return parse_or();
    ExprPtr e = parse_or();
    Chain chain(*this);
    while (is_name("if")) {
      chain.link();
      const int ln = line();
      ++i_;
      auto c = make(ExprKind::Cond, ln);
      const bool soft = soft_;
      soft_ = true;
      c->a = parse_or();
      c->b = std::move(e);
      if (is_name("else")) {
        ++i_;
        c->c = parse_expression(true);
      }
      soft_ = soft;
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r, int ln) {
    auto e = make(ExprKind::Binary, ln);
    e->name = std::move(op);
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    Chain chain(*this);
    while (is_name("or")) {
      chain.link();
      const int ln = line();
      ++i_;
      e = binary("or", std::move(e), parse_and(), ln);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    Chain chain(*this);
    while (is_name("and")) {
      chain.link();
      const int ln = line();
      ++i_;
      e = binary("and", std::move(e), parse_not(), ln);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      Depth depth(*this);
      auto e = make(ExprKind::Unary, line());
      ++i_;
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const int ln = line();
    ExprPtr first = parse_math1();
    std::vector<ExprPtr> items;
    std::vector<std::string> ops;
    for (;;) {
      std::string op;
      if (cur().type == Tok::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        ++i_;
        op = "in";
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        i_ += 2;
        op = "not in";
      } else {
        break;
      }
      ops.push_back(op);
      items.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = make(ExprKind::Compare, ln);
    e->items.push_back(std::move(first));
    for (auto& it : items) e->items.push_back(std::move(it));
    e->ops = std::move(ops);
    return e;
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    Chain chain(*this);
    while (is_op("+") || is_op("-")) {
      chain.link();
      const int ln = line();
      std::string op = next().text;
      e = binary(op, std::move(e), parse_concat(), ln);
    }
    return e;
  }
  ExprPtr parse_concat() {
    const int ln = line();
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto e = make(ExprKind::Concat, ln);
    e->items.push_back(std::move(first));
    while (is_op("~")) {
      ++i_;
      e->items.push_back(parse_math2());
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    Chain chain(*this);
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      chain.link();
      const int ln = line();
      std::string op = next().text;
      e = binary(op, std::move(e), parse_pow(), ln);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    Chain chain(*this);
    while (is_op("**")) {
      chain.link();
      const int ln = line();
      ++i_;
      e = binary("**", std::move(e), parse_unary(true), ln);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    Depth depth(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make(ExprKind::Unary, line());
      e->name = next().text;
      e->a = parse_unary(false);
    } else {
      e = parse_postfix(parse_primary());
    }
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const int ln = t.line;
    if (t.type == Tok::Name) {
      const std::string n = next().text;
      auto e = make(ExprKind::Literal, ln);
      if (n == "true" || n == "True") {
        e->literal = Value::boolean(true);
      } else if (n == "false" || n == "False") {
        e->literal = Value::boolean(false);
      } else if (n == "none" || n == "None") {
        e->literal = Value::none();
      } else {
        e->kind = ExprKind::Name;
        e->name = n;
        reads_.varargs = reads_.varargs || n == "varargs";
        reads_.kwargs = reads_.kwargs || n == "kwargs";
      }
      return e;
    }
    if (t.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += next().text;  // adjacent literals concatenate
      auto e = make(ExprKind::Literal, ln);
      e->literal = Value::string(std::move(s));
      return e;
    }
    if (t.type == Tok::Int || t.type == Tok::Float) {
      auto e = make(ExprKind::Literal, ln);
      const std::string text = next().text;
      if (t.type == Tok::Int) {
        e->literal = int_literal(text, ln);
      } else {
        e->literal = Value::number(std::strtod(text.c_str(), nullptr));
      }
      return e;
    }
    if (is_op("(")) {
      ++i_;
      if (is_op(")")) {
        ++i_;
        auto e = make(ExprKind::Tuple, ln);
        return e;
      }
      ExprPtr e = parse_tuple(true);
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++i_;
      auto e = make(ExprKind::List, ln);
      while (!is_op("]")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op("]")) break;
        e->items.push_back(parse_expression(true));
      }
      ++i_;
      return e;
    }
    if (is_op("{")) {
      ++i_;
      auto e = make(ExprKind::Dict, ln);
      while (!is_op("}")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op("}")) break;
        e->items.push_back(parse_expression(true));
        expect_op(":");
        e->items.push_back(parse_expression(true));
      }
      ++i_;
      return e;
    }
    unexpected("an expression");
  }

  // An integer literal (x.123 or 123); stoll throws past 64 bits.
  static Value int_literal(const std::string& text, int ln) {
    try {
      return Value::integer(std::stoll(text));
    } catch (const std::exception&) {
      fail_at(ln, fmt::format("integer literal {} is out of range: integers beyond 64 bits "
                              "are not supported",
                              text));
    }
  }

  ExprPtr parse_postfix(ExprPtr e) {
    Chain chain(*this);
    for (;;) {
      const int ln = line();
      if (is_op(".") || is_op("[") || is_op("(")) chain.link();
      if (is_op(".")) {
        ++i_;
        auto a = make(ExprKind::Attr, ln);
        a->a = std::move(e);
        if (cur().type == Tok::Int) {
          a->kind = ExprKind::Item;
          a->b = make(ExprKind::Literal, ln);
          a->b->literal = int_literal(next().text, ln);
        } else {
          a->name = expect_name();
        }
        e = std::move(a);
      } else if (is_op("[")) {
        ++i_;
        e = parse_subscript(std::move(e), ln);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, int ln) {
    ExprPtr parts[3];
    int n = 0;
    bool slice = false;
    for (;;) {
      if (is_op(":")) {
        slice = true;
        ++i_;
        if (++n > 2) unexpected("']'");
        continue;
      }
      if (is_op("]")) break;
      if (parts[n]) unexpected("':' or ']'");
      parts[n] = parse_expression(true);
    }
    ++i_;
    if (!slice) {
      if (!parts[0]) unexpected("an index");
      auto e = make(ExprKind::Item, ln);
      e->a = std::move(obj);
      e->b = std::move(parts[0]);
      return e;
    }
    auto e = make(ExprKind::Slice, ln);
    e->a = std::move(obj);
    e->b = std::move(parts[0]);
    e->c = std::move(parts[1]);
    e->d = std::move(parts[2]);
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (!e.args.empty() || !e.kwargs.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**"))
        fail_at(line(), "*args and **kwargs in calls are not supported");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string n = next().text;
        ++i_;
        for (const auto& [other, x] : e.kwargs) {
          if (other == n) fail_at(line(), fmt::format("keyword argument repeated: {}", n));
        }
        e.kwargs.emplace_back(std::move(n), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail_at(line(), "a positional argument follows a keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    ++i_;
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(ExprKind::Call, line());
    e->a = std::move(callee);
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string n = expect_name();
    while (is_op(".") && peek().type == Tok::Name) {
      ++i_;
      n += "." + next().text;
    }
    return n;
  }

  ExprPtr parse_filters(ExprPtr e, bool first_without_pipe = false) {
    bool first = first_without_pipe;
    Chain chain(*this);
    while (first || is_op("|")) {
      chain.link();
      if (!first) ++i_;
      first = false;
      const int ln = line();
      auto f = make(ExprKind::Filter, ln);
      f->name = dotted_name();
      if (!soft_ && !known_filter(f->name)) {
        fail_at(ln, fmt::format("no filter named '{}'", f->name));
      }
      f->a = std::move(e);
      if (is_op("(")) parse_call_args(*f);
      e = std::move(f);
    }
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    Chain chain(*this);
    for (;;) {
      if (is_op("|") || is_name("is") || is_op("(")) chain.link();
      if (is_op("|")) {
        e = parse_filters(std::move(e));
      } else if (is_name("is")) {
        const int ln = line();
        ++i_;
        auto t = make(ExprKind::Test, ln);
        if (is_name("not")) {
          ++i_;
          t->negated = true;
        }
        t->name = dotted_name();
        if (!soft_ && !known_test(t->name)) fail_at(ln, fmt::format("no test named '{}'", t->name));
        t->a = std::move(e);
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == Tok::Name || cur().type == Tok::String ||
                    cur().type == Tok::Int || cur().type == Tok::Float || is_op("[") ||
                    is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail_at(ln, "you cannot chain multiple tests with is");
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // for bodies around the statement being parsed: break needs one
  struct Reads {
    bool varargs = false;
    bool kwargs = false;
  } reads_;            // names the innermost macro body read so far
  bool soft_ = false;  // unknown filters and tests fail when run, not now
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(lex(source)).parse(); }

}  // namespace encore::jinja::detail
