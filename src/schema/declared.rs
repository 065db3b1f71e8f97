//! `model.name: declared`: a network written in YAML as a list of torch.nn layers (`Conv2d`, `BatchNorm2d`,
//! `ReLU`, `Linear`, ...) plus structure (`Sequential`, `Residual`, named blocks with arguments, `repeat`).
//! This module reads that list from the resolved config tree, where every node still knows the file:line or
//! override it came from, into a typed `DeclaredSpec`; unknown layers and arguments, missing or mistyped ones
//! are refused here, naming the key, the place and a fix. Shapes are checked later, against the data
//! (`model::declared`), since `in_channels`/`in_features` may be left out as `LazyConv2d` does.
//!
//! ```yaml
//! name: declared
//! blocks:                       # named blocks, defined once (or chosen from conf/model/block/)
//!   basic:
//!     args: {planes: 64, stride: 1}
//!     type: Residual
//!     body:
//!       - {type: Conv2d, out_channels: $planes, kernel_size: 3, stride: $stride, padding: 1, bias: false}
//!       - {type: BatchNorm2d}
//! layers:
//!   - {type: Conv2d, out_channels: 64, kernel_size: 3, padding: 1}
//!   - {block: basic, planes: 64, repeat: 2}    # an nn.Sequential of two copies
//!   - {type: Linear, out_features: 10}
//! ```

use crate::config::errors::{at, did_you_mean, ConfigError};
use crate::config::tree::{Map, Node, Value};
use std::collections::BTreeMap;

/// A declared network: its top-level layers (PyTorch's `nn.Sequential` of them).
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredSpec {
    pub layers: Vec<LayerDecl>,
}

/// One layer as written: what it is, the config key it was written at and where that key was set.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerDecl {
    pub kind: LayerKind,
    /// The config key of the layer (`model.layers.4.body.1`, or inside a block
    /// `model.layers.3 → model.blocks.basic.body.0`).
    pub key: String,
    /// `\n    (set at file:line)`, or empty.
    pub origin: String,
}

/// torch.nn's layers and the structure around them, with their keyword arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum LayerKind {
    Conv2d {
        in_channels: Option<usize>,
        out_channels: usize,
        kernel_size: usize,
        stride: usize,
        padding: usize,
        bias: bool,
    },
    BatchNorm2d {
        num_features: Option<usize>,
        eps: f64,
        momentum: f64,
    },
    /// Over `[features]` or `[channels, length]` samples (an MLP's hidden layers).
    BatchNorm1d {
        num_features: Option<usize>,
        eps: f64,
        momentum: f64,
    },
    ReLU,
    GELU {
        tanh: bool,
    },
    SiLU,
    Identity,
    MaxPool2d {
        kernel_size: usize,
        stride: usize,
        padding: usize,
    },
    AvgPool2d {
        kernel_size: usize,
        stride: usize,
    },
    AdaptiveAvgPool2d {
        output_size: usize,
    },
    Flatten {
        start_dim: i64,
        end_dim: i64,
    },
    Linear {
        in_features: Option<usize>,
        out_features: usize,
        bias: bool,
    },
    Dropout {
        p: f64,
    },
    LayerNorm {
        normalized_shape: Option<usize>,
        eps: f64,
    },
    Sequential(Vec<LayerDecl>),
    /// `body(x) + shortcut(x)`; no shortcut is the identity.
    Residual {
        body: Vec<LayerDecl>,
        shortcut: Option<Vec<LayerDecl>>,
    },
}

/// Layer names a declared model knows (torch.nn's, and the structural ones).
pub const LAYER_NAMES: &[&str] = &[
    "Conv2d",
    "BatchNorm2d",
    "BatchNorm1d",
    "ReLU",
    "GELU",
    "SiLU",
    "Identity",
    "MaxPool2d",
    "AvgPool2d",
    "AdaptiveAvgPool2d",
    "Flatten",
    "Linear",
    "Dropout",
    "LayerNorm",
    "Sequential",
    "Residual",
];

/// Keys of a `model` node that a declared model reads itself (the others are `ModelConfig`'s or free
/// variables for interpolation, e.g. `${model.width}`).
pub const DECLARED_KEYS: &[&str] = &["layers", "blocks"];

/// How deep block references may nest (a block that uses itself would recurse forever).
const MAX_BLOCK_DEPTH: usize = 32;

/// Read `model.layers` (and the named `model.blocks` they use) from the resolved `model` node.
pub fn parse(model: &Node) -> Result<DeclaredSpec, ConfigError> {
    let layers = model.child("layers").ok_or_else(|| {
        ConfigError::Schema(format!(
            "Error in config key 'model.layers': a declared model (model.name=declared) needs `layers`, \
             a list of torch.nn layers such as {{type: Conv2d, out_channels: 32, kernel_size: 3}}{}",
            at(&model.source)
        ))
    })?;
    let blocks = match model.child("blocks") {
        None => Map::new(),
        Some(Node {
            value: Value::Null, ..
        }) => Map::new(),
        Some(node) => node.as_map().cloned().ok_or_else(|| {
            schema_error(
                "model.blocks",
                &at(&node.source),
                "must be a mapping of block names to layers",
            )
        })?,
    };
    let reader = Reader { blocks: &blocks };
    let layers = reader.list(layers, "model.layers", 0)?;
    if layers.is_empty() {
        return Err(schema_error(
            "model.layers",
            &at(&model.source),
            "a declared model needs at least one layer",
        ));
    }
    Ok(DeclaredSpec { layers })
}

fn schema_error(key: &str, origin: &str, msg: &str) -> ConfigError {
    ConfigError::Schema(format!("Error in config key '{key}': {msg}{origin}"))
}

struct Reader<'a> {
    blocks: &'a Map,
}

impl Reader<'_> {
    /// A list of layers (a single layer mapping is taken as a list of one).
    fn list(&self, node: &Node, key: &str, depth: usize) -> Result<Vec<LayerDecl>, ConfigError> {
        match &node.value {
            Value::List(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| self.layer(item, &format!("{key}.{i}"), depth))
                .collect(),
            Value::Map(_) => Ok(vec![self.layer(node, key, depth)?]),
            _ => Err(schema_error(
                key,
                &at(&node.source),
                &format!(
                    "expected a list of layers, got {} '{}'",
                    node.type_name(),
                    node.value.display_python()
                ),
            )),
        }
    }

    /// One layer mapping: `{type: Conv2d, ...}`, `{_target_: torch.nn.Conv2d, ...}` or `{block: NAME, ...}`;
    /// any of them with `repeat: N` (an `nn.Sequential` of N copies).
    fn layer(&self, node: &Node, key: &str, depth: usize) -> Result<LayerDecl, ConfigError> {
        let origin = at(&node.source);
        let Some(map) = node.as_map() else {
            return Err(schema_error(
                key,
                &origin,
                &format!(
                    "a layer must be a mapping like {{type: ReLU}}, got {} '{}'",
                    node.type_name(),
                    node.value.display_python()
                ),
            ));
        };
        if let Some(times) = map.get("repeat") {
            let n = Args::int_of(times, &format!("{key}.repeat"))?;
            if n == 0 {
                return Err(schema_error(
                    &format!("{key}.repeat"),
                    &at(&times.source),
                    "repeat must be at least 1",
                ));
            }
            let mut single = node.clone();
            single.as_map_mut().map(|m| m.shift_remove("repeat"));
            let copy = self.layer(&single, key, depth)?;
            return Ok(LayerDecl {
                kind: LayerKind::Sequential(vec![copy; n]),
                key: key.to_string(),
                origin,
            });
        }
        if let Some(block) = map.get("block") {
            return self.block(node, map, block, key, depth);
        }
        let name = match (map.get("type"), map.get("_target_")) {
            (Some(t), None) => t.as_str().map(str::to_string),
            (None, Some(t)) => t.as_str().map(|s| {
                s.strip_prefix("torch.nn.")
                    .or_else(|| s.strip_prefix("torch.nn.modules."))
                    .unwrap_or(s)
                    .rsplit('.')
                    .next()
                    .unwrap_or(s)
                    .to_string()
            }),
            (Some(_), Some(_)) => {
                return Err(schema_error(
                    key,
                    &origin,
                    "a layer has either `type` or `_target_`, not both",
                ))
            }
            (None, None) => {
                return Err(schema_error(
                    key,
                    &origin,
                    "a layer needs `type` (a torch.nn layer such as Conv2d, or Sequential/Residual) or \
                     `block` (a name under model.blocks)",
                ))
            }
        };
        let name = name.ok_or_else(|| schema_error(key, &origin, "`type` must be a string"))?;
        // An unknown type is reported where the type was written (a file line, or an override).
        let type_origin = map
            .get("type")
            .or_else(|| map.get("_target_"))
            .map(|n| at(&n.source))
            .unwrap_or_else(|| origin.clone());
        let mut args = Args::new(map, (key, &name), &type_origin);
        let kind = self.kind(&name, &mut args, key, depth)?;
        args.finish()?;
        Ok(LayerDecl {
            kind,
            key: key.to_string(),
            origin,
        })
    }

    /// `{block: NAME, arg: value, ...}`: the block's definition with each `$arg` replaced.
    fn block(
        &self,
        node: &Node,
        map: &Map,
        block: &Node,
        key: &str,
        depth: usize,
    ) -> Result<LayerDecl, ConfigError> {
        let origin = at(&node.source);
        let name = block
            .as_str()
            .ok_or_else(|| schema_error(key, &origin, "`block` must be a block name"))?;
        let Some(def) = self.blocks.get(name) else {
            let mut msg = format!("there is no block '{name}' under model.blocks");
            match did_you_mean(name, self.blocks.keys().map(String::as_str)) {
                Some(s) => msg.push_str(&format!("\n    Did you mean '{s}'?")),
                None if self.blocks.is_empty() => {
                    msg.push_str("\n    Define it under model.blocks.<name>, or choose one with the defaults list: \
                                  `- block@blocks.<name>: <file in model/block/>`")
                }
                None => msg.push_str(&format!(
                    "\n    Blocks defined: {}",
                    self.blocks.keys().cloned().collect::<Vec<_>>().join(", ")
                )),
            }
            return Err(schema_error(
                &format!("{key}.block"),
                &at(&block.source),
                &msg,
            ));
        };
        if depth >= MAX_BLOCK_DEPTH {
            return Err(schema_error(
                key,
                &origin,
                &format!(
                    "block '{name}' nests more than {MAX_BLOCK_DEPTH} deep: does it use itself?"
                ),
            ));
        }
        let mut def = def.clone();
        let declared_args = def
            .as_map_mut()
            .and_then(|m| m.shift_remove("args"))
            .map(|a| a.as_map().cloned().unwrap_or_default())
            .unwrap_or_default();
        let mut values: BTreeMap<String, Node> = declared_args.into_iter().collect();
        for (arg, value) in map.iter().filter(|(k, _)| k.as_str() != "block") {
            if !values.contains_key(arg) && !mentions(&def, arg) {
                let mut msg = format!("block '{name}' has no argument '{arg}'");
                let known: Vec<String> = values.keys().cloned().collect();
                if let Some(s) = did_you_mean(arg, known.iter().map(String::as_str)) {
                    msg.push_str(&format!("\n    Did you mean '{s}'?"));
                } else if !known.is_empty() {
                    msg.push_str(&format!("\n    Its arguments: {}", known.join(", ")));
                }
                return Err(schema_error(
                    &format!("{key}.{arg}"),
                    &at(&value.source),
                    &msg,
                ));
            }
            values.insert(arg.clone(), value.clone());
        }
        let inner_key = format!("{key} → model.blocks.{name}");
        substitute(&mut def, &values, &inner_key)?;
        let mut layer = self.layer(&def, &inner_key, depth + 1)?;
        layer.origin = format!("{}{origin}", layer.origin);
        Ok(layer)
    }

    fn kind(
        &self,
        name: &str,
        a: &mut Args,
        key: &str,
        depth: usize,
    ) -> Result<LayerKind, ConfigError> {
        Ok(match name {
            "Conv2d" | "LazyConv2d" => {
                let kernel_size = a.square("kernel_size", None)?;
                a.only("dilation", 1)?;
                a.only("groups", 1)?;
                a.only_str("padding_mode", "zeros")?;
                LayerKind::Conv2d {
                    in_channels: a.opt_int("in_channels")?,
                    out_channels: a.int("out_channels", None)?,
                    kernel_size,
                    stride: a.square("stride", Some(1))?,
                    padding: a.square("padding", Some(0))?,
                    bias: a.bool("bias", true)?,
                }
            }
            "BatchNorm2d" | "LazyBatchNorm2d" | "BatchNorm1d" | "LazyBatchNorm1d" => {
                a.only_bool("affine", true)?;
                a.only_bool("track_running_stats", true)?;
                let (num_features, eps, momentum) = (
                    a.opt_int("num_features")?,
                    a.float("eps", 1e-5)?,
                    a.float("momentum", 0.1)?,
                );
                match name.ends_with("1d") {
                    true => LayerKind::BatchNorm1d {
                        num_features,
                        eps,
                        momentum,
                    },
                    false => LayerKind::BatchNorm2d {
                        num_features,
                        eps,
                        momentum,
                    },
                }
            }
            "ReLU" | "SiLU" | "Identity" => {
                // `inplace` changes no value or gradient.
                a.bool("inplace", false)?;
                match name {
                    "ReLU" => LayerKind::ReLU,
                    "SiLU" => LayerKind::SiLU,
                    _ => LayerKind::Identity,
                }
            }
            "GELU" => LayerKind::GELU {
                tanh: match a.str("approximate", "none")?.as_str() {
                    "none" => false,
                    "tanh" => true,
                    other => {
                        return Err(
                            a.bad("approximate", &format!("'{other}' is not 'none' or 'tanh'"))
                        )
                    }
                },
            },
            "MaxPool2d" => {
                let kernel_size = a.square("kernel_size", None)?;
                a.only("dilation", 1)?;
                a.only_bool("ceil_mode", false)?;
                a.only_bool("return_indices", false)?;
                LayerKind::MaxPool2d {
                    kernel_size,
                    stride: a.square("stride", Some(kernel_size))?,
                    padding: a.square("padding", Some(0))?,
                }
            }
            "AvgPool2d" => {
                let kernel_size = a.square("kernel_size", None)?;
                a.only("padding", 0)?;
                a.only_bool("ceil_mode", false)?;
                a.bool("count_include_pad", true)?;
                LayerKind::AvgPool2d {
                    kernel_size,
                    stride: a.square("stride", Some(kernel_size))?,
                }
            }
            "AdaptiveAvgPool2d" => LayerKind::AdaptiveAvgPool2d {
                output_size: a.square("output_size", None)?,
            },
            "Flatten" => LayerKind::Flatten {
                start_dim: a.signed("start_dim", 1)?,
                end_dim: a.signed("end_dim", -1)?,
            },
            "Linear" | "LazyLinear" => LayerKind::Linear {
                in_features: a.opt_int("in_features")?,
                out_features: a.int("out_features", None)?,
                bias: a.bool("bias", true)?,
            },
            "Dropout" => {
                a.bool("inplace", false)?;
                let p = a.float("p", 0.5)?;
                if !(0.0..1.0).contains(&p) {
                    return Err(a.bad("p", &format!("dropout probability {p} is outside [0, 1)")));
                }
                LayerKind::Dropout { p }
            }
            "LayerNorm" => {
                a.only_bool("elementwise_affine", true)?;
                a.only_bool("bias", true)?;
                LayerKind::LayerNorm {
                    normalized_shape: a.opt_int("normalized_shape")?,
                    eps: a.float("eps", 1e-5)?,
                }
            }
            "Sequential" => {
                let layers = a.take_required("layers")?;
                LayerKind::Sequential(self.list(&layers, &format!("{key}.layers"), depth)?)
            }
            "Residual" => {
                let body = a.take_required("body")?;
                let body = self.list(&body, &format!("{key}.body"), depth)?;
                let shortcut = match a.take("shortcut") {
                    None
                    | Some(Node {
                        value: Value::Null, ..
                    }) => None,
                    Some(s) => Some(self.list(&s, &format!("{key}.shortcut"), depth)?),
                };
                LayerKind::Residual { body, shortcut }
            }
            other => {
                let mut msg = format!("unknown layer '{other}'");
                let blocks: Vec<&str> = self.blocks.keys().map(String::as_str).collect();
                let same_letters = LAYER_NAMES
                    .iter()
                    .find(|n| n.eq_ignore_ascii_case(other))
                    .map(|n| n.to_string());
                match same_letters.or_else(|| did_you_mean(other, LAYER_NAMES.iter().copied())) {
                    Some(s) => msg.push_str(&format!("\n    Did you mean '{s}'?")),
                    None if blocks.contains(&other) => msg.push_str(&format!(
                        "\n    '{other}' is a block: write {{block: {other}}}"
                    )),
                    None => {
                        msg.push_str(&format!("\n    Known layers: {}", LAYER_NAMES.join(", ")))
                    }
                }
                return Err(schema_error(&format!("{key}.type"), a.origin, &msg));
            }
        })
    }
}

/// Does `node` (a block's definition) mention `$arg` anywhere?
fn mentions(node: &Node, arg: &str) -> bool {
    match &node.value {
        Value::Str(s) => s.strip_prefix('$') == Some(arg),
        Value::List(items) => items.iter().any(|n| mentions(n, arg)),
        Value::Map(m) => m.values().any(|n| mentions(n, arg)),
        _ => false,
    }
}

/// Replace every string `$arg` in a block's definition by the argument's value.
fn substitute(
    node: &mut Node,
    values: &BTreeMap<String, Node>,
    key: &str,
) -> Result<(), ConfigError> {
    match &mut node.value {
        Value::Str(s) => {
            if let Some(arg) = s.strip_prefix('$').filter(|a| is_identifier(a)) {
                match values.get(arg) {
                    Some(v) => *node = v.clone(),
                    None => {
                        return Err(schema_error(
                            key,
                            &at(&node.source),
                            &format!(
                                "the block uses ${arg} but no value is given for '{arg}'\n    \
                                 Pass it where the block is used ({{block: ..., {arg}: <value>}}) or give a \
                                 default under the block's `args`"
                            ),
                        ))
                    }
                }
            }
        }
        Value::List(items) => {
            for item in items {
                substitute(item, values, key)?;
            }
        }
        Value::Map(m) => {
            for (k, v) in m.iter_mut() {
                // A nested block reference keeps its own arguments' names.
                if k != "args" {
                    substitute(v, values, key)?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A layer's keyword arguments, taken one by one; what is left at the end is an unknown argument.
struct Args<'a> {
    map: Map,
    key: &'a str,
    /// The layer's type, as written.
    layer: &'a str,
    origin: &'a str,
    known: Vec<&'static str>,
}

impl<'a> Args<'a> {
    fn new(map: &Map, (key, layer): (&'a str, &'a str), origin: &'a str) -> Self {
        let mut map = map.clone();
        map.shift_remove("type");
        map.shift_remove("_target_");
        Args {
            map,
            key,
            layer,
            origin,
            known: Vec::new(),
        }
    }

    fn bad(&self, arg: &str, msg: &str) -> ConfigError {
        let origin = self
            .map
            .get(arg)
            .map(|n| at(&n.source))
            .unwrap_or_else(|| self.origin.to_string());
        schema_error(&format!("{}.{arg}", self.key), &origin, msg)
    }

    fn take(&mut self, arg: &'static str) -> Option<Node> {
        self.known.push(arg);
        self.map.shift_remove(arg)
    }

    fn take_required(&mut self, arg: &'static str) -> Result<Node, ConfigError> {
        match self.take(arg) {
            Some(n) => Ok(n),
            None => Err(self.missing(arg)),
        }
    }

    /// `arg` is required and absent: a typo of it among the arguments given is the error to report.
    fn missing(&self, arg: &str) -> ConfigError {
        let typo = self
            .map
            .iter()
            .find(|(k, _)| did_you_mean(k, [arg]).is_some());
        match typo {
            Some((k, node)) => schema_error(
                &format!("{}.{k}", self.key),
                &at(&node.source),
                &format!(
                    "{} has no argument '{k}'\n    Did you mean '{arg}'?",
                    self.layer
                ),
            ),
            None => schema_error(
                self.key,
                self.origin,
                &format!("{} needs `{arg}`", self.layer),
            ),
        }
    }

    fn int_of(node: &Node, key: &str) -> Result<usize, ConfigError> {
        match node.value {
            Value::Int(i) if i >= 0 => Ok(i as usize),
            _ => Err(schema_error(
                key,
                &at(&node.source),
                &format!(
                    "expected a non-negative integer, got {} '{}'",
                    node.type_name(),
                    node.value.display_python()
                ),
            )),
        }
    }

    fn int(&mut self, arg: &'static str, default: Option<usize>) -> Result<usize, ConfigError> {
        match (self.take(arg), default) {
            (Some(n), _) => Self::int_of(&n, &format!("{}.{arg}", self.key)),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(self.missing(arg)),
        }
    }

    fn opt_int(&mut self, arg: &'static str) -> Result<Option<usize>, ConfigError> {
        match self.take(arg) {
            None
            | Some(Node {
                value: Value::Null, ..
            }) => Ok(None),
            Some(n) => Self::int_of(&n, &format!("{}.{arg}", self.key)).map(Some),
        }
    }

    fn signed(&mut self, arg: &'static str, default: i64) -> Result<i64, ConfigError> {
        match self.take(arg) {
            None => Ok(default),
            Some(Node {
                value: Value::Int(i),
                ..
            }) => Ok(i),
            Some(n) => Err(schema_error(
                &format!("{}.{arg}", self.key),
                &at(&n.source),
                &format!("expected an integer, got '{}'", n.value.display_python()),
            )),
        }
    }

    /// An int, or a pair of equal ints (`3` or `[3, 3]`): the builders take square windows.
    fn square(&mut self, arg: &'static str, default: Option<usize>) -> Result<usize, ConfigError> {
        let key = format!("{}.{arg}", self.key);
        match self.take(arg) {
            Some(Node {
                value: Value::List(items),
                source,
                ..
            }) => {
                let v: Vec<usize> = items
                    .iter()
                    .map(|n| Self::int_of(n, &key))
                    .collect::<Result<_, _>>()?;
                match v[..] {
                    [a, b] if a == b => Ok(a),
                    _ => Err(schema_error(
                        &key,
                        &at(&source),
                        &format!(
                            "{v:?}: only square windows are supported (one int, or two equal ones)"
                        ),
                    )),
                }
            }
            Some(n) => Self::int_of(&n, &key),
            None => default.ok_or_else(|| self.missing(arg)),
        }
    }

    fn float(&mut self, arg: &'static str, default: f64) -> Result<f64, ConfigError> {
        match self.take(arg) {
            None => Ok(default),
            Some(Node {
                value: Value::Float(f),
                ..
            }) => Ok(f),
            Some(Node {
                value: Value::Int(i),
                ..
            }) => Ok(i as f64),
            Some(n) => Err(schema_error(
                &format!("{}.{arg}", self.key),
                &at(&n.source),
                &format!("expected a number, got '{}'", n.value.display_python()),
            )),
        }
    }

    fn bool(&mut self, arg: &'static str, default: bool) -> Result<bool, ConfigError> {
        match self.take(arg) {
            None => Ok(default),
            Some(Node {
                value: Value::Bool(b),
                ..
            }) => Ok(b),
            Some(n) => Err(schema_error(
                &format!("{}.{arg}", self.key),
                &at(&n.source),
                &format!("expected true or false, got '{}'", n.value.display_python()),
            )),
        }
    }

    fn str(&mut self, arg: &'static str, default: &str) -> Result<String, ConfigError> {
        match self.take(arg) {
            None => Ok(default.to_string()),
            Some(n) => n.as_str().map(str::to_string).ok_or_else(|| {
                schema_error(
                    &format!("{}.{arg}", self.key),
                    &at(&n.source),
                    &format!("expected a string, got '{}'", n.value.display_python()),
                )
            }),
        }
    }

    /// An argument torch.nn has but the builders support at one value only: that value, or a clear refusal.
    fn only(&mut self, arg: &'static str, supported: usize) -> Result<(), ConfigError> {
        if let Some(n) = self.map.get(arg).cloned() {
            let v = self.square(arg, None)?;
            if v != supported {
                return Err(schema_error(
                    &format!("{}.{arg}", self.key),
                    &at(&n.source),
                    &format!("{arg}={v} is not supported by declared models (only {supported})"),
                ));
            }
        }
        self.known.push(arg);
        Ok(())
    }

    fn only_bool(&mut self, arg: &'static str, supported: bool) -> Result<(), ConfigError> {
        let source = self.map.get(arg).map(|n| at(&n.source));
        if self.bool(arg, supported)? != supported {
            return Err(schema_error(
                &format!("{}.{arg}", self.key),
                &source.unwrap_or_default(),
                &format!("{arg}={} is not supported by declared models", !supported),
            ));
        }
        Ok(())
    }

    fn only_str(&mut self, arg: &'static str, supported: &str) -> Result<(), ConfigError> {
        let source = self.map.get(arg).map(|n| at(&n.source));
        let v = self.str(arg, supported)?;
        if v != supported {
            return Err(schema_error(
                &format!("{}.{arg}", self.key),
                &source.unwrap_or_default(),
                &format!("{arg}='{v}' is not supported by declared models (only '{supported}')"),
            ));
        }
        Ok(())
    }

    /// Every argument must have been read: anything left is unknown to this layer.
    fn finish(self) -> Result<(), ConfigError> {
        let layer = self.layer;
        let Some((arg, node)) = self.map.iter().next() else {
            return Ok(());
        };
        let mut msg = format!("{layer} has no argument '{arg}'");
        match did_you_mean(arg, self.known.iter().copied()) {
            Some(s) => msg.push_str(&format!("\n    Did you mean '{s}'?")),
            None if self.known.is_empty() => msg.push_str(" (it takes none)"),
            None => msg.push_str(&format!("\n    Its arguments: {}", self.known.join(", "))),
        }
        Err(schema_error(
            &format!("{}.{arg}", self.key),
            &at(&node.source),
            &msg,
        ))
    }
}

#[cfg(test)]
mod tests;
