//! Which shape a chat template expects message content in, decided as vLLM decides it for its
//! `--chat-template-content-format auto` (vLLM 0.34 `renderers/hf.py` `_detect_content_format`):
//!
//! * **openai**: content is a list of parts (`{"type": "text", "text": …}`, `{"type": "image"}`), because
//!   the template loops over a message's content;
//! * **string**: content is one string (text parts joined by `"\n"`, image placeholders in front).
//!
//! The template is parsed (minijinja's parser) and its AST searched: the *message variables* are the
//! targets of `{% for X in messages %}` loops, where `messages` may be reached through aliases
//! (`{% set a = messages[1:] %}`, `namespace(rest=messages)`, `{% set ns.rest = messages %}`; filters,
//! tests and slices are looked through, an integer index is not). The format is openai iff some
//! `{% for … in Z %}` loops over `X.content` / `X['content']` of a message variable (again through
//! filters, tests and slices), over a macro parameter that a call site binds to such an expression, or
//! over a bare variable named `content` outside any macro. A template that does not parse, or has no
//! such loop, is string.

use minijinja::machinery::ast::{CallArg, Expr, Stmt};
use minijinja::machinery::parse;
use minijinja::syntax::SyntaxConfig;

/// How message content is handed to the template.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ContentFormat {
    /// Content as one string.
    #[default]
    String,
    /// Content as a list of OpenAI-style parts.
    #[serde(rename = "openai")]
    OpenAi,
}

impl ContentFormat {
    pub fn label(self) -> &'static str {
        match self {
            ContentFormat::String => "string",
            ContentFormat::OpenAi => "openai",
        }
    }
}

/// The format vLLM's `auto` detection picks for `source` (see the module docs).
pub fn detect(source: &str) -> ContentFormat {
    let Ok(root) = parse(source, "<chat template>", SyntaxConfig::default()) else {
        return ContentFormat::String;
    };
    let mut stmts = Vec::new();
    flatten(&root, false, &mut stmts);
    let aliases = message_list_aliases(&stmts);
    let message_vars: Vec<&str> = stmts
        .iter()
        .filter_map(|(s, _)| match s {
            Stmt::ForLoop(l) if is_path_in(&l.iter, &aliases) => var_name(&l.target),
            _ => None,
        })
        .collect();
    let is_content = |e: &Expr<'_>| match path(unwrap(e)).as_deref() {
        Some([var, field]) => field == "content" && message_vars.contains(&var.as_str()),
        _ => false,
    };
    let content_params = macro_params_bound_to_content(&stmts, &is_content);
    let openai = stmts.iter().any(|(s, in_macro)| {
        let Stmt::ForLoop(l) = s else { return false };
        let iter = unwrap(&l.iter);
        is_content(iter)
            || var_name(iter).is_some_and(|v| content_params.iter().any(|p| p == v) || (v == "content" && !in_macro))
    });
    if openai {
        ContentFormat::OpenAi
    } else {
        ContentFormat::String
    }
}

/// Every statement of the tree with whether it sits inside a macro.
fn flatten<'s, 'a>(stmt: &'s Stmt<'a>, in_macro: bool, out: &mut Vec<(&'s Stmt<'a>, bool)>) {
    out.push((stmt, in_macro));
    let mut walk = |body: &'s [Stmt<'a>], in_macro: bool| body.iter().for_each(|s| flatten(s, in_macro, out));
    match stmt {
        Stmt::Template(t) => walk(&t.children, in_macro),
        Stmt::ForLoop(l) => {
            walk(&l.body, in_macro);
            walk(&l.else_body, in_macro);
        }
        Stmt::IfCond(c) => {
            walk(&c.true_body, in_macro);
            walk(&c.false_body, in_macro);
        }
        Stmt::WithBlock(w) => walk(&w.body, in_macro),
        Stmt::SetBlock(s) => walk(&s.body, in_macro),
        Stmt::AutoEscape(a) => walk(&a.body, in_macro),
        Stmt::FilterBlock(f) => walk(&f.body, in_macro),
        Stmt::Macro(m) => walk(&m.body, true),
        Stmt::CallBlock(c) => walk(&c.macro_decl.body, true),
        _ => {}
    }
}

/// Looks through filters, tests and slices to the value they apply to.
fn unwrap<'s, 'a>(e: &'s Expr<'a>) -> &'s Expr<'a> {
    match e {
        Expr::Filter(f) => f.expr.as_ref().map_or(e, unwrap),
        Expr::Test(t) => unwrap(&t.expr),
        Expr::Slice(s) => unwrap(&s.expr),
        _ => e,
    }
}

/// `a`, `a.b`, `a['b']` as a list of names; anything else is not a path.
fn path(e: &Expr<'_>) -> Option<Vec<String>> {
    match e {
        Expr::Var(v) => Some(vec![v.id.to_owned()]),
        Expr::GetAttr(g) => path(&g.expr).map(|mut p| {
            p.push(g.name.to_owned());
            p
        }),
        Expr::GetItem(g) => {
            let Expr::Const(c) = &g.subscript_expr else { return None };
            let key = c.value.as_str()?.to_owned();
            path(&g.expr).map(|mut p| {
                p.push(key);
                p
            })
        }
        _ => None,
    }
}

fn var_name<'a>(e: &Expr<'a>) -> Option<&'a str> {
    match e {
        Expr::Var(v) => Some(v.id),
        _ => None,
    }
}

fn is_path_in(e: &Expr<'_>, set: &[Vec<String>]) -> bool {
    path(unwrap(e)).is_some_and(|p| set.contains(&p))
}

/// `messages` and every name that is (transitively) set to it.
fn message_list_aliases(stmts: &[(&Stmt<'_>, bool)]) -> Vec<Vec<String>> {
    let mut aliases = vec![vec!["messages".to_owned()]];
    loop {
        let before = aliases.len();
        for (s, _) in stmts {
            let Stmt::Set(set) = s else { continue };
            let mut found = Vec::new();
            if is_path_in(&set.expr, &aliases) {
                found.extend(path(&set.target));
            } else if let (Some(ns), Expr::Call(call)) = (var_name(&set.target), &set.expr) {
                // {% set ns = namespace(rest=messages) %} → ns.rest
                if var_name(&call.expr) == Some("namespace") {
                    for arg in &call.args {
                        if let CallArg::Kwarg(k, v) = arg {
                            if is_path_in(v, &aliases) {
                                found.push(vec![ns.to_owned(), (*k).to_owned()]);
                            }
                        }
                    }
                }
            }
            for f in found {
                if !aliases.contains(&f) {
                    aliases.push(f);
                }
            }
        }
        if aliases.len() == before {
            return aliases;
        }
    }
}

/// Parameters of macros that some call site binds (by position or keyword) to a message's content.
fn macro_params_bound_to_content(stmts: &[(&Stmt<'_>, bool)], is_content: &dyn Fn(&Expr<'_>) -> bool) -> Vec<String> {
    let macros: Vec<(&str, Vec<&str>)> = stmts
        .iter()
        .filter_map(|(s, _)| match s {
            Stmt::Macro(m) => Some((m.name, m.args.iter().filter_map(var_name).collect())),
            _ => None,
        })
        .collect();
    let mut bound = Vec::new();
    let mut visit = |e: &Expr<'_>| {
        let Expr::Call(call) = e else { return };
        let Some((_, params)) = var_name(&call.expr).and_then(|n| macros.iter().find(|(m, _)| *m == n)) else {
            return;
        };
        for (i, arg) in call.args.iter().enumerate() {
            let param = match arg {
                CallArg::Pos(v) if is_content(v) => params.get(i).copied(),
                CallArg::Kwarg(k, v) if is_content(v) => Some(*k),
                _ => None,
            };
            bound.extend(param.map(str::to_owned));
        }
    };
    for (s, _) in stmts {
        stmt_exprs(s, &mut |e| visit_expr(e, &mut visit));
    }
    bound
}

/// The expressions a statement holds directly (not those of nested statements).
fn stmt_exprs<'s, 'a>(stmt: &'s Stmt<'a>, f: &mut dyn FnMut(&'s Expr<'a>)) {
    match stmt {
        Stmt::EmitExpr(e) => f(&e.expr),
        Stmt::ForLoop(l) => {
            f(&l.iter);
            if let Some(e) = &l.filter_expr {
                f(e);
            }
        }
        Stmt::IfCond(c) => f(&c.expr),
        Stmt::WithBlock(w) => w.assignments.iter().for_each(|(_, v)| f(v)),
        Stmt::Set(s) => f(&s.expr),
        Stmt::SetBlock(s) => {
            if let Some(e) = &s.filter {
                f(e);
            }
        }
        Stmt::Do(d) => d.call.args.iter().for_each(|a| call_arg(a, f)),
        Stmt::CallBlock(c) => c.call.args.iter().for_each(|a| call_arg(a, f)),
        _ => {}
    }
}

fn call_arg<'s, 'a>(arg: &'s CallArg<'a>, f: &mut dyn FnMut(&'s Expr<'a>)) {
    match arg {
        CallArg::Pos(e) | CallArg::Kwarg(_, e) | CallArg::PosSplat(e) | CallArg::KwargSplat(e) => f(e),
    }
}

/// Calls `f` on `e` and every expression inside it.
fn visit_expr<'s, 'a>(e: &'s Expr<'a>, f: &mut dyn FnMut(&'s Expr<'a>)) {
    f(e);
    let mut sub = |x: &'s Expr<'a>| visit_expr(x, f);
    match e {
        Expr::Slice(s) => {
            sub(&s.expr);
            [&s.start, &s.stop, &s.step].into_iter().flatten().for_each(sub);
        }
        Expr::UnaryOp(u) => sub(&u.expr),
        Expr::BinOp(b) => {
            sub(&b.left);
            sub(&b.right);
        }
        Expr::Compare(c) => {
            sub(&c.expr);
            c.ops.iter().for_each(|o| sub(&o.expr));
        }
        Expr::IfExpr(i) => {
            sub(&i.test_expr);
            sub(&i.true_expr);
            if let Some(e) = &i.false_expr {
                sub(e);
            }
        }
        Expr::Filter(fl) => {
            if let Some(e) = &fl.expr {
                sub(e);
            }
            fl.args.iter().for_each(|a| call_arg(a, &mut sub));
        }
        Expr::Test(t) => {
            sub(&t.expr);
            t.args.iter().for_each(|a| call_arg(a, &mut sub));
        }
        Expr::GetAttr(g) => sub(&g.expr),
        Expr::GetItem(g) => {
            sub(&g.expr);
            sub(&g.subscript_expr);
        }
        Expr::Call(c) => {
            sub(&c.expr);
            c.args.iter().for_each(|a| call_arg(a, &mut sub));
        }
        Expr::List(l) => l.items.iter().for_each(sub),
        Expr::Tuple(t) => t.items.iter().for_each(sub),
        Expr::Map(m) => m.keys.iter().chain(&m.values).for_each(sub),
        Expr::Var(_) | Expr::Const(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(t: &str) -> &'static str {
        detect(t).label()
    }

    #[test]
    fn loops_over_message_content_are_openai() {
        assert_eq!(
            fmt("{% for m in messages %}{% for c in m['content'] %}{{ c.text }}{% endfor %}{% endfor %}"),
            "openai"
        );
        assert_eq!(fmt("{% for m in messages %}{% for c in m.content | selectattr('type', 'equalto', 'text') %}{% endfor %}{% endfor %}"), "openai");
        // through an alias of messages, a slice and a namespace
        assert_eq!(
            fmt("{% set rest = messages[1:] %}{% for m in rest %}{% for c in m.content %}{% endfor %}{% endfor %}"),
            "openai"
        );
        assert_eq!(fmt("{% set ns = namespace(msgs=messages) %}{% for m in ns.msgs %}{% for c in m.content %}{% endfor %}{% endfor %}"), "openai");
        assert_eq!(fmt("{% set ns = namespace() %}{% set ns.msgs = messages %}{% for m in ns.msgs %}{% for c in m['content'] %}{% endfor %}{% endfor %}"), "openai");
        // a macro parameter bound to the content, by position or keyword
        assert_eq!(fmt("{% macro r(parts) %}{% for p in parts %}{% endfor %}{% endmacro %}{% for m in messages %}{{ r(m.content) }}{% endfor %}"), "openai");
        assert_eq!(fmt("{% macro r(x, parts) %}{% for p in parts %}{% endfor %}{% endmacro %}{% for m in messages %}{{ r(1, parts=m['content']) }}{% endfor %}"), "openai");
        // a bare variable named content, outside a macro
        assert_eq!(
            fmt("{% for m in messages %}{% set content = m.content %}{% for c in content %}{% endfor %}{% endfor %}"),
            "openai"
        );
    }

    #[test]
    fn everything_else_is_string() {
        assert_eq!(fmt("{% for m in messages %}{{ m['content'] }}{% endfor %}"), "string");
        assert_eq!(fmt("{{ messages[0]['content'][0]['text'] }}"), "string");
        // an integer index is not an alias of the list
        assert_eq!(fmt("{% set first = messages[0] %}{% for c in first.content %}{% endfor %}"), "string");
        // a loop over content of something that is not a message
        assert_eq!(fmt("{% for t in tools %}{% for c in t.content %}{% endfor %}{% endfor %}"), "string");
        assert_eq!(fmt("{% macro r(content) %}{% for c in content %}{% endfor %}{% endmacro %}"), "string");
        assert_eq!(fmt("{% for %}"), "string", "a template that does not parse");
        assert_eq!(fmt(""), "string");
    }
}
