//! `${...}` interpolation with OmegaConf semantics: absolute (`${a.b}`) and relative (`${.x}`, `${..y}`) keys,
//! string interpolation (`x_${a}`), resolvers (`oc.env`, `oc.select`, `oc.decode`, `now`), nesting, and cycle
//! detection. Errors name the key being resolved, the reference, and where the reference was written.

use super::errors::{at, ConfigError};
use super::tree::{split_key, Map, Node, Source, Value};
use std::collections::HashMap;

/// What resolvers may read: a launch time fixed once (`${now:}` is the same in every rank and job) and env vars.
#[derive(Debug, Clone)]
pub struct ResolveContext {
    /// Kept in the offset it was taken in: a worker on a node in another time zone formats rank 0's
    /// launch time as rank 0 does, so every node names the same run directory.
    pub now: chrono::DateTime<chrono::FixedOffset>,
    pub env: HashMap<String, String>,
    /// The job's resolved `hydra` node, served by `${hydra:runtime.output_dir}`; known once a job is placed.
    pub hydra: Option<Node>,
}

impl ResolveContext {
    pub fn from_process() -> Self {
        ResolveContext {
            now: chrono::Local::now().fixed_offset(),
            env: std::env::vars().collect(),
            hydra: None,
        }
    }
}

/// Resolve every interpolation in `root`, returning a new tree. `???` values stay `???`.
pub fn resolve_all(root: &Node, ctx: &ResolveContext) -> Result<Node, ConfigError> {
    with_resolver(root, ctx, |r| r.resolve_node("", root))
}

/// Resolve every interpolation in `root` as OmegaConf's `resolve` does (what `--cfg job --resolve`
/// prints): an interpolation that reaches a `???` value, directly or through others, is left `???`
/// instead of failing; every other error still fails.
pub fn resolve_leaving_missing(root: &Node, ctx: &ResolveContext) -> Result<Node, ConfigError> {
    with_resolver(root, ctx, |r| {
        r.leave_missing = true;
        r.resolve_node("", root)
    })
}

/// Resolve the node at `path` only.
pub fn resolve_path(root: &Node, path: &str, ctx: &ResolveContext) -> Result<Node, ConfigError> {
    with_resolver(root, ctx, |r| r.resolve_at(path, &Source::Internal, path))
}

/// Resolve `hydra.<key>` for the job whose config is `job_cfg` (`ctx.hydra` holds the `hydra` node), as
/// `${hydra:<key>}` would.
pub fn resolve_hydra_key(
    job_cfg: &Node,
    key: &str,
    ctx: &ResolveContext,
) -> Result<Node, ConfigError> {
    let source = Source::Internal;
    let arg = Node::new(Value::Str(key.to_string()), source.clone());
    with_resolver(job_cfg, ctx, |r| {
        r.call("hydra", vec![arg], &format!("hydra.{key}"), &source)
    })
}

/// A resolver over `root` (with the context's `hydra` node beside it), for one call.
fn with_resolver<T>(root: &Node, ctx: &ResolveContext, f: impl FnOnce(&mut Resolver) -> T) -> T {
    let (combined, hydra_from_ctx) = with_hydra(root, ctx);
    let mut r = Resolver {
        root: &combined,
        ctx,
        cache: HashMap::new(),
        stack: Vec::new(),
        hydra_from_ctx,
        leave_missing: false,
        unaddressable: 0,
    };
    f(&mut r)
}

/// The tree `${hydra:...}` reads from: the job's config with the context's `hydra` node beside it (so
/// `hydra.run.dir: ${paths.log_dir}/...` sees the job's keys, as under Hydra), resolved lazily: a field
/// nobody reads (`hydra.job.num` in a single run) may stay `???`.
fn with_hydra<'a>(root: &'a Node, ctx: &ResolveContext) -> (std::borrow::Cow<'a, Node>, bool) {
    match (&ctx.hydra, root.child("hydra")) {
        (Some(hydra), None) if root.as_map().is_some() => {
            let mut combined = root.clone();
            if let Some(m) = combined.as_map_mut() {
                m.insert("hydra".into(), hydra.clone());
            }
            (std::borrow::Cow::Owned(combined), true)
        }
        _ => (std::borrow::Cow::Borrowed(root), false),
    }
}

fn is_hydra_path(path: &str) -> bool {
    path == "hydra" || path.starts_with("hydra.")
}

struct Resolver<'a> {
    root: &'a Node,
    ctx: &'a ResolveContext,
    cache: HashMap<String, Node>,
    stack: Vec<String>,
    /// The `hydra` node came from the context: the job's own keys may reach it only through
    /// `${hydra:...}` (under Hydra the job's config has no `hydra` key).
    hydra_from_ctx: bool,
    /// OmegaConf's `resolve`: an interpolation to a missing value becomes `???` (`resolve_leaving_missing`).
    leave_missing: bool,
    /// How many keys no path can name (`.`, `a.b`) enclose the node being resolved.
    unaddressable: usize,
}

/// A parsed piece of a string: literal text or a `${...}` expression.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Interp(Expr),
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    /// A node reference; the key may itself contain interpolations.
    Key(Vec<Piece>),
    Resolver {
        name: String,
        args: Vec<Arg>,
    },
}

/// A resolver argument: its pieces, and whether it was quoted (quoted args are always strings).
#[derive(Debug, Clone, PartialEq)]
struct Arg {
    pieces: Vec<Piece>,
    quoted: bool,
}

impl Resolver<'_> {
    fn resolve_node(&mut self, path: &str, node: &Node) -> Result<Node, ConfigError> {
        match &node.value {
            // Under a key no path can name (`.`, `a.b`, `[0]` as a key) the path would find another node
            // (the root, for `.`), so the value is evaluated where it is (found by fuzzing: the root
            // resolved inside itself until the stack overflowed).
            Value::Str(s) if s.contains("${") && self.unaddressable > 0 => {
                match self.eval_string(s, path, &node.source) {
                    Err(e) if self.leave_missing && is_to_missing(&e) => {
                        Ok(Node::new(Value::Missing, node.source.clone()))
                    }
                    other => other,
                }
            }
            Value::Str(s) if s.contains("${") => match self.resolve_at(path, &node.source, path) {
                Err(e) if self.leave_missing && is_to_missing(&e) => {
                    Ok(Node::new(Value::Missing, node.source.clone()))
                }
                other => other,
            },
            Value::Map(m) => {
                let mut out = Map::new();
                for (k, v) in m {
                    let child = join(path, k);
                    let named = split_key(k) == [k.as_str()];
                    self.unaddressable += usize::from(!named);
                    let resolved = self.resolve_node(&child, v);
                    self.unaddressable -= usize::from(!named);
                    out.insert(k.clone(), resolved?);
                }
                Ok(Node::new(Value::Map(out), node.source.clone()))
            }
            Value::List(l) => {
                let mut out = Vec::with_capacity(l.len());
                for (i, v) in l.iter().enumerate() {
                    out.push(self.resolve_node(&join(path, &i.to_string()), v)?);
                }
                Ok(Node::new(Value::List(out), node.source.clone()))
            }
            _ => Ok(node.clone()),
        }
    }

    /// Resolve the node at `path` (memoized, cycle-checked). `origin`/`source` say who asked, for errors.
    fn resolve_at(
        &mut self,
        path: &str,
        source: &Source,
        origin: &str,
    ) -> Result<Node, ConfigError> {
        if let Some(hit) = self.cache.get(path) {
            return Ok(hit.clone());
        }
        if let Some(pos) = self.stack.iter().position(|p| p == path) {
            let mut chain: Vec<&str> = self.stack[pos..].iter().map(String::as_str).collect();
            chain.push(path);
            return Err(ConfigError::Interpolation(format!(
                "Recursive interpolation detected: {}\n    full_key: {origin}{}",
                chain.join(" -> "),
                at(source)
            )));
        }
        let root = self.root;
        let hidden = self.hydra_from_ctx
            && is_hydra_path(path)
            && !self.stack.iter().any(|p| is_hydra_path(p));
        let Some(node) = root.get(path).filter(|_| !hidden) else {
            return Err(ConfigError::Interpolation(format!(
                "Interpolation key '{path}' not found\n    full_key: {origin}{}",
                at(source)
            )));
        };
        self.stack.push(path.to_string());
        let result = match &node.value {
            Value::Str(s) if s.contains("${") => self.eval_string(s, path, &node.source),
            _ => self.resolve_node(path, node),
        };
        self.stack.pop();
        let result = result?;
        self.cache.insert(path.to_string(), result.clone());
        Ok(result)
    }

    fn eval_string(
        &mut self,
        text: &str,
        path: &str,
        source: &Source,
    ) -> Result<Node, ConfigError> {
        let pieces = parse_pieces(text).map_err(|e| {
            ConfigError::Interpolation(format!(
                "Error parsing interpolation '{text}': {e}\n    full_key: {path}{}",
                at(source)
            ))
        })?;
        self.eval_pieces(&pieces, path, source)
    }

    fn eval_pieces(
        &mut self,
        pieces: &[Piece],
        path: &str,
        source: &Source,
    ) -> Result<Node, ConfigError> {
        if let [Piece::Interp(expr)] = pieces {
            return self.eval_expr(expr, path, source);
        }
        let mut out = String::new();
        for piece in pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Interp(expr) => {
                    let node = self.eval_expr(expr, path, source)?;
                    out.push_str(&node.value.display_python());
                }
            }
        }
        Ok(Node::new(Value::Str(out), source.clone()))
    }

    fn eval_expr(&mut self, expr: &Expr, path: &str, source: &Source) -> Result<Node, ConfigError> {
        match expr {
            Expr::Key(pieces) => {
                let key = self
                    .eval_pieces(pieces, path, source)?
                    .value
                    .display_python();
                let target = absolute_key(path, &key);
                let node = self
                    .resolve_at(&target, source, path)
                    .map_err(|e| match e {
                        ConfigError::Interpolation(m)
                            if m.starts_with(&format!("Interpolation key '{target}'")) =>
                        {
                            // OmegaConf names a relative key without its dots (`${..y}`: 'y').
                            ConfigError::Interpolation(format!(
                                "Interpolation key '{}' not found\n    full_key: {path}{}",
                                key.trim_start_matches('.'),
                                at(source)
                            ))
                        }
                        other => other,
                    })?;
                if node.is_missing() {
                    return Err(missing_error(&target, path, source));
                }
                Ok(node)
            }
            Expr::Resolver { name, args } => {
                let mut values = Vec::with_capacity(args.len());
                for arg in args {
                    let mut v = self.eval_pieces(&arg.pieces, path, source)?;
                    if arg.quoted && !matches!(v.value, Value::Str(_)) {
                        // A quoted argument is a string, even when it is one interpolation.
                        v = Node::new(Value::Str(v.value.display_python()), v.source);
                    }
                    let v = match (&v.value, arg.quoted) {
                        (Value::Str(s), false)
                            if arg.pieces.iter().all(|p| matches!(p, Piece::Text(_))) =>
                        {
                            Node::new(super::yaml::resolve_plain(s.trim()), source.clone())
                        }
                        _ => v,
                    };
                    values.push(v);
                }
                self.call(name, values, path, source)
            }
        }
    }

    fn call(
        &mut self,
        name: &str,
        args: Vec<Node>,
        path: &str,
        source: &Source,
    ) -> Result<Node, ConfigError> {
        let err = |msg: String| {
            ConfigError::Interpolation(format!("{msg}\n    full_key: {path}{}", at(source)))
        };
        let text = |n: &Node| n.value.display_python();
        match name {
            "oc.env" => {
                let var = args
                    .first()
                    .map(text)
                    .ok_or_else(|| err("oc.env needs a variable name".into()))?;
                match self.ctx.env.get(&var) {
                    Some(v) => Ok(Node::new(
                        Value::Str(v.clone()),
                        Source::Env(var.as_str().into()),
                    )),
                    None => match args.get(1) {
                        Some(d) if d.value == Value::Null => {
                            Ok(Node::new(Value::Null, source.clone()))
                        }
                        Some(d) => Ok(Node::new(Value::Str(text(d)), source.clone())),
                        None => Err(err(format!(
                            "KeyError raised while resolving interpolation: \"Environment variable '{var}' not found\""
                        ))),
                    },
                }
            }
            "oc.select" => {
                let key = args
                    .first()
                    .map(text)
                    .ok_or_else(|| err("oc.select needs a key".into()))?;
                let target = absolute_key(path, &key);
                if self.root.get(&target).is_some_and(|n| !n.is_missing()) {
                    self.resolve_at(&target, source, path)
                } else {
                    Ok(args
                        .get(1)
                        .cloned()
                        .unwrap_or(Node::new(Value::Null, source.clone())))
                }
            }
            "oc.decode" => {
                let arg = args
                    .first()
                    .cloned()
                    .unwrap_or(Node::new(Value::Null, source.clone()));
                match &arg.value {
                    Value::Str(s) => {
                        let parsed = super::grammar::parse_override(&format!("k={s}"))
                            .map_err(|e| err(format!("oc.decode could not decode '{s}': {e}")))?;
                        match parsed.value {
                            Some(super::grammar::ParsedValue::Element(e)) => {
                                let node = super::compose::element_to_node(&e, source);
                                if node.is_interpolation() {
                                    let text = node.as_str().unwrap_or_default().to_string();
                                    self.eval_string(&text, path, source)
                                } else {
                                    Ok(node)
                                }
                            }
                            _ => Err(err(format!("oc.decode could not decode '{s}'"))),
                        }
                    }
                    Value::Null => Ok(arg),
                    other => Err(err(format!(
                        "TypeError raised while resolving interpolation: oc.decode expects a string input, got {}",
                        other.type_name()
                    ))),
                }
            }
            "hydra" => {
                let key = args.first().map(text).unwrap_or_default();
                if self.root.child("hydra").is_none() {
                    return Err(err(format!(
                        "ValueError raised while resolving interpolation: HydraConfig was not set\n    \
                         ${{hydra:{key}}} is known once a job is placed (a run, or --cfg with --resolve)"
                    )));
                }
                let target = format!("hydra.{key}");
                if self.root.get(&target).is_none() {
                    return Err(err(format!("Interpolation key 'hydra.{key}' not found")));
                }
                // Entering the `hydra` node: its own `${hydra.job.num}`-style keys are visible from here.
                self.stack.push("hydra".into());
                let node = self.resolve_at(&target, source, path);
                self.stack.pop();
                // `OmegaConf.select` on Hydra's config: a key that is itself `???` reads as null
                // (`runtime.output_dir` before a job is placed); an interpolation inside the `hydra`
                // node that reaches one still fails, as above.
                let node = node?;
                if node.is_missing() {
                    return Ok(Node::new(Value::Null, source.clone()));
                }
                Ok(node)
            }
            "now" => {
                let fmt = args.first().map(text).unwrap_or_default();
                // chrono reports a directive it does not know by failing the write (`to_string` would
                // panic on it: found by fuzzing).
                let mut stamp = String::new();
                if std::fmt::Write::write_fmt(
                    &mut stamp,
                    format_args!("{}", self.ctx.now.format(&fmt)),
                )
                .is_err()
                {
                    return Err(err(format!(
                        "now: '{fmt}' is not a strftime format (%Y, %m, %d, %H, %M, %S, ...; a literal % is %%)"
                    )));
                }
                Ok(Node::new(Value::Str(stamp), source.clone()))
            }
            "oc.dict.keys" | "oc.dict.values" => {
                let key = args.first().map(text).unwrap_or_default();
                let target = absolute_key(path, &key);
                let node = self.resolve_at(&target, source, path)?;
                let Value::Map(m) = node.value else {
                    return Err(err(format!("{name} expects a dict at '{key}'")));
                };
                let items = if name == "oc.dict.keys" {
                    m.keys()
                        .map(|k| Node::new(Value::Str(k.clone()), source.clone()))
                        .collect()
                } else {
                    m.into_values().collect()
                };
                Ok(Node::new(Value::List(items), source.clone()))
            }
            _ => Err(err(format!("Unsupported interpolation type {name}"))),
        }
    }
}

/// OmegaConf's `InterpolationToMissingValueError`, whose message starts this way.
const TO_MISSING: &str = "MissingMandatoryValue while resolving interpolation:";

fn is_to_missing(e: &ConfigError) -> bool {
    matches!(e, ConfigError::Interpolation(m) if m.starts_with(TO_MISSING))
}

fn missing_error(target: &str, path: &str, source: &Source) -> ConfigError {
    ConfigError::Interpolation(format!(
        "{TO_MISSING} Missing mandatory value: {target}\n    full_key: {path}{}\n    \
         Set {target} (in its config file or with {target}=<value>) before it is used.",
        at(source)
    ))
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// `.x` is relative to the container holding `path`; each further dot climbs one level.
fn absolute_key(path: &str, key: &str) -> String {
    let dots = key.chars().take_while(|c| *c == '.').count();
    if dots == 0 {
        return key.to_string();
    }
    let rest = &key[dots..];
    let mut parts = split_key(path);
    parts.pop(); // the node itself
    for _ in 1..dots {
        parts.pop();
    }
    let base = parts.join(".");
    if rest.is_empty() {
        base
    } else {
        join(&base, rest)
    }
}

/// Split a string into literal text and `${...}` expressions. `\${` is a literal `${`.
fn parse_pieces(text: &str) -> Result<Vec<Piece>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut pos = 0;
    let pieces = parse_until(&chars, &mut pos, &[])?;
    Ok(pieces)
}

fn parse_until(chars: &[char], pos: &mut usize, stops: &[char]) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    while *pos < chars.len() {
        let c = chars[*pos];
        if stops.contains(&c) {
            break;
        }
        if c == '\\' && chars.get(*pos + 1) == Some(&'$') && chars.get(*pos + 2) == Some(&'{') {
            text.push_str("${");
            *pos += 3;
            continue;
        }
        if c == '\\' && chars.get(*pos + 1) == Some(&'\\') && chars.get(*pos + 2) == Some(&'$') {
            text.push('\\');
            *pos += 2;
            continue;
        }
        if c == '$' && chars.get(*pos + 1) == Some(&'{') {
            if !text.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
            }
            *pos += 2;
            pieces.push(Piece::Interp(parse_expr(chars, pos)?));
            continue;
        }
        text.push(c);
        *pos += 1;
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// After `${`: a key or `resolver:args`, up to the matching `}`.
fn parse_expr(chars: &[char], pos: &mut usize) -> Result<Expr, String> {
    skip_ws(chars, pos);
    // A resolver name is `[A-Za-z_][\w.]*` followed by `:`.
    let start = *pos;
    let mut end = start;
    while end < chars.len()
        && (chars[end].is_alphanumeric() || chars[end] == '_' || chars[end] == '.')
    {
        end += 1;
    }
    let looks_like_resolver = end > start
        && !chars[start].is_ascii_digit()
        && chars[start] != '.'
        && chars.get(end) == Some(&':');
    if looks_like_resolver {
        let name: String = chars[start..end].iter().collect();
        *pos = end + 1;
        let mut args = Vec::new();
        skip_ws(chars, pos);
        if chars.get(*pos) == Some(&'}') {
            *pos += 1;
            return Ok(Expr::Resolver { name, args });
        }
        loop {
            skip_ws(chars, pos);
            let arg = parse_arg(chars, pos)?;
            args.push(arg);
            skip_ws(chars, pos);
            match chars.get(*pos) {
                Some(',') => *pos += 1,
                Some('}') => {
                    *pos += 1;
                    return Ok(Expr::Resolver { name, args });
                }
                _ => return Err(format!("missing '}}' to close the call of '{name}'")),
            }
        }
    }
    let pieces = parse_until(chars, pos, &['}'])?;
    if chars.get(*pos) != Some(&'}') {
        return Err("missing '}' to close '${'".into());
    }
    *pos += 1;
    let pieces = trim_pieces(pieces);
    if pieces.is_empty() {
        return Err("empty interpolation '${}'".into());
    }
    Ok(Expr::Key(pieces))
}

fn parse_arg(chars: &[char], pos: &mut usize) -> Result<Arg, String> {
    if let Some(&q) = chars.get(*pos).filter(|c| **c == '\'' || **c == '"') {
        *pos += 1;
        let mut pieces = Vec::new();
        let mut text = String::new();
        loop {
            match chars.get(*pos) {
                None => return Err("unterminated quoted string".into()),
                Some(&c) if c == q => {
                    *pos += 1;
                    break;
                }
                Some('\\') if chars.get(*pos + 1) == Some(&q) => {
                    text.push(q);
                    *pos += 2;
                }
                Some('$') if chars.get(*pos + 1) == Some(&'{') => {
                    if !text.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut text)));
                    }
                    *pos += 2;
                    pieces.push(Piece::Interp(parse_expr(chars, pos)?));
                }
                Some(&c) => {
                    text.push(c);
                    *pos += 1;
                }
            }
        }
        if !text.is_empty() || pieces.is_empty() {
            pieces.push(Piece::Text(text));
        }
        return Ok(Arg {
            pieces,
            quoted: true,
        });
    }
    // Unquoted: up to a top-level ',' or '}' (brackets nest, `\,` escapes).
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut depth = 0i32;
    while let Some(&c) = chars.get(*pos) {
        if depth == 0 && (c == ',' || c == '}') {
            break;
        }
        if c == '\\'
            && chars
                .get(*pos + 1)
                .is_some_and(|n| ",}{[]():= \\".contains(*n))
        {
            text.push(chars[*pos + 1]);
            *pos += 2;
            continue;
        }
        if c == '$' && chars.get(*pos + 1) == Some(&'{') {
            if !text.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
            }
            *pos += 2;
            pieces.push(Piece::Interp(parse_expr(chars, pos)?));
            continue;
        }
        match c {
            '[' | '{' => depth += 1,
            ']' | '}' => depth -= 1,
            _ => {}
        }
        text.push(c);
        *pos += 1;
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(Arg {
        pieces: trim_pieces(pieces),
        quoted: false,
    })
}

fn trim_pieces(mut pieces: Vec<Piece>) -> Vec<Piece> {
    if let Some(Piece::Text(t)) = pieces.first_mut() {
        *t = t.trim_start().to_string();
    }
    if let Some(Piece::Text(t)) = pieces.last_mut() {
        *t = t.trim_end().to_string();
    }
    pieces.retain(|p| !matches!(p, Piece::Text(t) if t.is_empty()));
    pieces
}

fn skip_ws(chars: &[char], pos: &mut usize) {
    while chars.get(*pos).is_some_and(|c| c.is_whitespace()) {
        *pos += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::yaml;
    use rstest::rstest;

    fn ctx() -> ResolveContext {
        let mut env = HashMap::new();
        env.insert("TY_VAR".to_string(), "from_env".to_string());
        ResolveContext {
            now: chrono::Local::now().fixed_offset(),
            env,
            hydra: None,
        }
    }

    fn resolve(text: &str, key: &str) -> Result<serde_json::Value, ConfigError> {
        let root = yaml::parse(text, "t.yaml").unwrap().unwrap();
        resolve_all(&root, &ctx()).map(|n| n.get(key).unwrap().to_json())
    }

    #[rstest]
    #[case("a: 1\nb: ${a}", "b", serde_json::json!(1))]
    #[case("a: {x: 1}\nb: ${a}", "b", serde_json::json!({"x": 1}))]
    #[case("a: 1\nb: x_${a}_y", "b", serde_json::json!("x_1_y"))]
    #[case("a:\n  x: 1\n  y: ${.x}", "a.y", serde_json::json!(1))]
    #[case("z: 5\na:\n  b:\n    y: ${..c}\n  c: 3", "a.b.y", serde_json::json!(3))]
    #[case("a: ${oc.env:TY_VAR}", "a", serde_json::json!("from_env"))]
    #[case("a: ${oc.env:NOPE_NOT_SET,fallback}", "a", serde_json::json!("fallback"))]
    #[case("a: ${oc.env:NOPE_NOT_SET,null}", "a", serde_json::json!(null))]
    #[case("a: ${oc.select:missing.key,7}", "a", serde_json::json!(7))]
    #[case("a: ${oc.decode:'[1, 2]'}", "a", serde_json::json!([1, 2]))]
    #[case("a: 2\nb: ${oc.decode:'${a}'}", "b", serde_json::json!(2))]
    #[case("a: \\${not}", "a", serde_json::json!("${not}"))]
    #[case("k: b\nd: {b: 9}\nv: ${d.${k}}", "v", serde_json::json!(9))]
    #[case("l: [10, 20]\nv: ${l.1}", "v", serde_json::json!(20))]
    fn resolves(#[case] text: &str, #[case] key: &str, #[case] expected: serde_json::Value) {
        assert_eq!(resolve(text, key).unwrap(), expected);
    }

    /// A key no path can name resolves where it is (found by fuzzing: `.` resolved the root inside
    /// itself until the stack overflowed).
    #[test]
    fn a_key_no_path_names_resolves_in_place() {
        let root = yaml::parse("m: 1\n.: ${m}\n'a.b': x_${m}\n", "t.yaml")
            .unwrap()
            .unwrap();
        let json = resolve_all(&root, &ctx()).unwrap().to_json();
        assert_eq!(json, serde_json::json!({"m": 1, ".": 1, "a.b": "x_1"}));
    }

    #[rstest]
    #[case("a: ${b}\nb: ${a}", "Recursive interpolation detected")]
    #[case("a: ${nope}", "Interpolation key 'nope' not found")]
    #[case("a: ???\nb: ${a}", "Missing mandatory value")]
    #[case(
        "a: ${oc.env:NOPE_NOT_SET}",
        "Environment variable 'NOPE_NOT_SET' not found"
    )]
    #[case("a: ${foo:1}", "Unsupported interpolation type foo")]
    #[case("a: ${b", "missing '}'")]
    #[case(r"a: ${now:%H-%\\file}", r"now: '%H-%\file' is not a strftime format")]
    fn errors_name_the_problem(#[case] text: &str, #[case] expected: &str) {
        let err = resolve(text, "a").unwrap_err().to_string();
        assert!(err.contains(expected), "{err}");
        assert!(err.contains("t.yaml:"), "error names the file: {err}");
    }

    #[test]
    fn now_is_fixed_per_context() {
        let root = yaml::parse("a: ${now:%Y}\nb: ${now:%Y}", "t")
            .unwrap()
            .unwrap();
        let c = ctx();
        let out = resolve_all(&root, &c).unwrap();
        assert_eq!(
            out.get("a").unwrap().to_json(),
            serde_json::json!(c.now.format("%Y").to_string())
        );
        assert_eq!(out.get("a").unwrap().value, out.get("b").unwrap().value);
    }
}
