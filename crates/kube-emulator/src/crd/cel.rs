//! A small subset of CEL, enough for the `x-kubernetes-validations` rules CRDs like the
//! snapshot ones declare: `self`/`oldSelf` with field selection, `has(...)`, `size(...)`,
//! `!`, `&&`, `||`, comparisons, parentheses, and int/string/bool literals. Rules outside the
//! subset fail to parse and are not enforced (the caller logs them at debug level).
//!
//! Field names escaped as CEL requires (`__namespace__`, `__dash__`, ...) are unescaped.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    Bool(bool),
    Int(i64),
    Str(String),
    /// `self.a.b` / `oldSelf.a` (root, fields).
    Path(bool, Vec<String>),
    Has(Box<Expr>),
    Size(Box<Expr>),
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Cmp(String, Box<Expr>, Box<Expr>),
}

impl Expr {
    /// Whether the rule is a transition rule (mentions `oldSelf`).
    pub fn uses_old_self(&self) -> bool {
        match self {
            Expr::Path(old, _) => *old,
            Expr::Has(e) | Expr::Size(e) | Expr::Not(e) => e.uses_old_self(),
            Expr::And(a, b) | Expr::Or(a, b) | Expr::Cmp(_, a, b) => {
                a.uses_old_self() || b.uses_old_self()
            }
            _ => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Int(i64),
    Str(String),
    Op(&'static str),
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(chars[start..i].iter().collect()));
            continue;
        }
        if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            out.push(Tok::Int(text.parse().map_err(|_| "bad int".to_string())?));
            continue;
        }
        if c == '"' || c == '\'' {
            let start = i + 1;
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' {
                    return Err("escapes are not supported".into());
                }
                i += 1;
            }
            if i >= chars.len() {
                return Err("unterminated string".into());
            }
            out.push(Tok::Str(chars[start..i].iter().collect()));
            i += 1;
            continue;
        }
        let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
        let op = match two.as_str() {
            "&&" => Some("&&"),
            "||" => Some("||"),
            "==" => Some("=="),
            "!=" => Some("!="),
            ">=" => Some(">="),
            "<=" => Some("<="),
            _ => None,
        };
        if let Some(op) = op {
            out.push(Tok::Op(op));
            i += 2;
            continue;
        }
        let op = match c {
            '!' => "!",
            '(' => "(",
            ')' => ")",
            '.' => ".",
            '>' => ">",
            '<' => "<",
            _ => return Err(format!("unsupported character {c:?}")),
        };
        out.push(Tok::Op(op));
        i += 1;
    }
    Ok(out)
}

fn unescape(ident: &str) -> String {
    if let Some(inner) = ident
        .strip_prefix("__")
        .and_then(|s| s.strip_suffix("__"))
        .filter(|s| !s.is_empty() && !s.contains("__"))
    {
        return match inner {
            "dash" => "-".into(),
            "dot" => ".".into(),
            "slash" => "/".into(),
            other => other.into(),
        };
    }
    ident
        .replace("__dash__", "-")
        .replace("__dot__", ".")
        .replace("__slash__", "/")
        .replace("__underscores__", "__")
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn eat(&mut self, op: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Op(o)) if *o == op) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, op: &str) -> Result<(), String> {
        if self.eat(op) {
            Ok(())
        } else {
            Err(format!("expected {op}"))
        }
    }

    fn or(&mut self) -> Result<Expr, String> {
        let mut left = self.and()?;
        while self.eat("||") {
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut left = self.unary()?;
        while self.eat("&&") {
            left = Expr::And(Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, String> {
        if self.eat("!") {
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        self.cmp()
    }

    fn cmp(&mut self) -> Result<Expr, String> {
        let left = self.primary()?;
        for op in ["==", "!=", ">=", "<=", ">", "<"] {
            if self.eat(op) {
                let right = self.primary()?;
                return Ok(Expr::Cmp(op.to_string(), Box::new(left), Box::new(right)));
            }
        }
        Ok(left)
    }

    fn path(&mut self, root: &str) -> Result<Expr, String> {
        let old = match root {
            "self" => false,
            "oldSelf" => true,
            other => return Err(format!("unsupported identifier {other}")),
        };
        let mut fields = Vec::new();
        while self.eat(".") {
            match self.peek().cloned() {
                Some(Tok::Ident(f)) => {
                    self.pos += 1;
                    fields.push(unescape(&f));
                }
                _ => return Err("expected a field name".into()),
            }
        }
        if matches!(self.peek(), Some(Tok::Op("("))) {
            return Err("method calls are not supported".into());
        }
        Ok(Expr::Path(old, fields))
    }

    fn primary(&mut self) -> Result<Expr, String> {
        let tok = self.peek().cloned().ok_or("unexpected end")?;
        self.pos += 1;
        match tok {
            Tok::Op("(") => {
                let e = self.or()?;
                self.expect(")")?;
                Ok(e)
            }
            Tok::Int(n) => Ok(Expr::Int(n)),
            Tok::Str(s) => Ok(Expr::Str(s)),
            Tok::Ident(id) => match id.as_str() {
                "true" => Ok(Expr::Bool(true)),
                "false" => Ok(Expr::Bool(false)),
                "has" | "size" => {
                    self.expect("(")?;
                    let inner = self.or()?;
                    self.expect(")")?;
                    if id == "has" {
                        if !matches!(&inner, Expr::Path(_, f) if !f.is_empty()) {
                            return Err("has() needs a field selection".into());
                        }
                        Ok(Expr::Has(Box::new(inner)))
                    } else {
                        Ok(Expr::Size(Box::new(inner)))
                    }
                }
                root => self.path(root),
            },
            Tok::Op(o) => Err(format!("unexpected {o}")),
        }
    }
}

/// Parses a rule of the supported subset.
pub(crate) fn parse(src: &str) -> Result<Expr, String> {
    let mut p = Parser {
        toks: lex(src)?,
        pos: 0,
    };
    let e = p.or()?;
    if p.pos != p.toks.len() {
        return Err("trailing input".into());
    }
    Ok(e)
}

#[derive(Debug, Clone, PartialEq)]
enum Val {
    Bool(bool),
    Int(i64),
    Json(Value),
}

fn lookup<'a>(root: &'a Value, fields: &[String]) -> Option<&'a Value> {
    fields.iter().try_fold(root, |v, f| v.get(f))
}

fn value(e: &Expr, this: &Value, old: Option<&Value>) -> Option<Val> {
    match e {
        Expr::Bool(b) => Some(Val::Bool(*b)),
        Expr::Int(n) => Some(Val::Int(*n)),
        Expr::Str(s) => Some(Val::Json(Value::String(s.clone()))),
        Expr::Path(is_old, fields) => {
            let root = if *is_old { old? } else { this };
            let v = lookup(root, fields)?;
            Some(match v {
                Value::Bool(b) => Val::Bool(*b),
                Value::Number(n) if n.is_i64() => Val::Int(n.as_i64()?),
                other => Val::Json(other.clone()),
            })
        }
        Expr::Has(inner) => {
            let Expr::Path(is_old, fields) = inner.as_ref() else {
                return None;
            };
            let root = if *is_old { old? } else { this };
            let (last, parent) = fields.split_last()?;
            let parent = lookup(root, parent)?;
            Some(Val::Bool(
                parent.as_object()?.get(last).is_some_and(|v| !v.is_null()),
            ))
        }
        Expr::Size(inner) => {
            let n = match value(inner, this, old)? {
                Val::Json(Value::String(s)) => s.chars().count(),
                Val::Json(Value::Array(a)) => a.len(),
                Val::Json(Value::Object(m)) => m.len(),
                _ => return None,
            };
            Some(Val::Int(i64::try_from(n).ok()?))
        }
        Expr::Not(inner) => match value(inner, this, old)? {
            Val::Bool(b) => Some(Val::Bool(!b)),
            _ => None,
        },
        Expr::And(a, b) => {
            // CEL's commutative short-circuit: false wins over an error.
            let (x, y) = (truth(a, this, old), truth(b, this, old));
            match (x, y) {
                (Some(false), _) | (_, Some(false)) => Some(Val::Bool(false)),
                (Some(true), Some(true)) => Some(Val::Bool(true)),
                _ => None,
            }
        }
        Expr::Or(a, b) => {
            let (x, y) = (truth(a, this, old), truth(b, this, old));
            match (x, y) {
                (Some(true), _) | (_, Some(true)) => Some(Val::Bool(true)),
                (Some(false), Some(false)) => Some(Val::Bool(false)),
                _ => None,
            }
        }
        Expr::Cmp(op, a, b) => {
            let (x, y) = (value(a, this, old)?, value(b, this, old)?);
            let ord = match (&x, &y) {
                (Val::Int(p), Val::Int(q)) => Some(p.cmp(q)),
                (Val::Json(Value::String(p)), Val::Json(Value::String(q))) => Some(p.cmp(q)),
                _ => None,
            };
            let r = match op.as_str() {
                "==" => x == y,
                "!=" => x != y,
                ">" => ord? == std::cmp::Ordering::Greater,
                ">=" => ord? != std::cmp::Ordering::Less,
                "<" => ord? == std::cmp::Ordering::Less,
                "<=" => ord? != std::cmp::Ordering::Greater,
                _ => return None,
            };
            Some(Val::Bool(r))
        }
    }
}

fn truth(e: &Expr, this: &Value, old: Option<&Value>) -> Option<bool> {
    match value(e, this, old)? {
        Val::Bool(b) => Some(b),
        _ => None,
    }
}

/// Evaluates a rule; `None` when evaluation fails (a missing field, a type mismatch), which
/// the caller does not count as a violation.
pub(crate) fn eval(e: &Expr, this: &Value, old: Option<&Value>) -> Option<bool> {
    truth(e, this, old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(rule: &str, this: Value, old: Option<Value>) -> Option<bool> {
        let e = parse(rule).expect("parses");
        eval(&e, &this, old.as_ref())
    }

    #[test]
    fn snapshot_crd_rules() {
        assert_eq!(
            run("self == oldSelf", json!("a"), Some(json!("a"))),
            Some(true)
        );
        assert_eq!(
            run("self == oldSelf", json!("a"), Some(json!("b"))),
            Some(false)
        );
        assert_eq!(run("size(self) > 0", json!(""), None), Some(false));
        let xor = "(has(self.volumeHandle) && !has(self.snapshotHandle)) || (!has(self.volumeHandle) && has(self.snapshotHandle))";
        assert_eq!(run(xor, json!({"volumeHandle": "v"}), None), Some(true));
        assert_eq!(run(xor, json!({}), None), Some(false));
        assert_eq!(
            run(
                xor,
                json!({"volumeHandle": "v", "snapshotHandle": "s"}),
                None
            ),
            Some(false)
        );
        let once = "!has(oldSelf.volumeHandle) || has(self.volumeHandle)";
        assert_eq!(
            run(once, json!({}), Some(json!({"volumeHandle": "v"}))),
            Some(false)
        );
        assert_eq!(run(once, json!({}), Some(json!({}))), Some(true));
        let both = "has(self.name) && has(self.__namespace__)";
        assert_eq!(
            run(both, json!({"name": "a", "namespace": "b"}), None),
            Some(true)
        );
        assert_eq!(run(both, json!({"name": "a"}), None), Some(false));
    }

    #[test]
    fn outside_the_subset_does_not_parse() {
        assert!(parse("self.all(x, x > 0)").is_err());
        assert!(parse("self.matches('^a')").is_err());
        assert!(parse("self in ['a']").is_err());
    }
}
