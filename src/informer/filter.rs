//! A resource's CEL filter (`[[resources]] filter`): which objects of the resource
//! kubesink follows at all.
//!
//! The expression is compiled once, at start (`kubesink check` reports a syntax error with
//! its line and column, and a variable no resource filter has), with the `cel` crate
//! (cel-rust: the Common Expression Language the Kubernetes API server uses for validation
//! rules and admission policies), its standard library and its strings and lists extensions
//! (`lowerAscii`, `split`, `flatten`, …).
//!
//! # Variables
//!
//! | name | CEL type | value |
//! |---|---|---|
//! | `object` | map | the object as the API server sent it, `metadata.managedFields` left out and, for Secrets without `allow_secret_data`, `data`, `stringData` and the annotations that repeat them removed (the same redaction as the message) |
//! | `cluster` | string | the cluster's name |
//! | `kind` | string | the resource's kind, `Pod` |
//! | `ns` | string | the object's namespace, `""` for a cluster-scoped object (CEL reserves the word `namespace`: the language definition's reserved identifiers) |
//!
//! `op` and `changed` are not variables of a resource filter: whether kubesink follows an
//! object depends on the object alone, never on how its change arrived, so that a restart's
//! list (all `added`) and the watch decide alike.
//!
//! # Evaluation
//!
//! The expression must give a `bool`. `true`: the object is followed; `false`: it is not,
//! as if the API server had not sent it. Anything else (an error: a missing field, a type
//! mismatch; or a non-`bool` result) is **no match**, counted in
//! `kubesink_filter_errors_total{resource}` and logged at WARN once per resource (with the
//! object's key and the error); write `has(object.status.phase) && …` for fields an object
//! may lack.
//!
//! # Bounds
//!
//! CEL has no unbounded loops: a comprehension (`all`, `exists`, `map`, `filter`) runs once
//! per element of a list or map of the object, which the API server bounds (1.5 MiB per
//! object in etcd). What an expression may build is bounded by what it may say: at most
//! [`MAX_SOURCE_BYTES`] of source, nested at most [`MAX_DEPTH`] deep, with at most
//! [`MAX_COMPREHENSION_NESTING`] comprehensions inside one another (so its work is at most
//! the square of an object's largest list).
//!
//! # Cost
//!
//! Only the parts of the object the expression can reach are built as CEL values for it,
//! straight from the watch line's JSON (`cel_values.rs`): an expression that reads
//! `object.status.phase` parses no `spec` and, of `status`, only `phase`. The paths are found
//! in the compiled expression: `object.a.b`, `object["a"]["b"]`, `has(object.a.b)`; any other
//! use of a value (passed whole to a function, iterated, indexed by a variable) builds all of
//! it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};
use cel::common::types::{CelList, CelMap, CelMapKey};
use kubesink_core::message::Context;
use serde_json::{Map, Value};

use super::cel_values::{self, string, Reach};
use super::object::RawObject;

/// The most bytes of source an expression may have.
pub const MAX_SOURCE_BYTES: usize = 4096;
/// The deepest the parser nests an expression (cel's own default is 96).
pub const MAX_DEPTH: u16 = 32;
/// The most comprehensions (`all`, `exists`, `exists_one`, `map`, `filter`) nested inside
/// one another.
pub const MAX_COMPREHENSION_NESTING: usize = 2;

/// The stack of the thread an expression is parsed on (see [`Filter::compile`]).
const COMPILE_STACK_BYTES: usize = 256 << 20;

/// The variables a resource filter has.
pub const VARIABLES: [&str; 4] = ["object", "cluster", "kind", "ns"];

/// The variables of an Event (of `events.k8s.io/v1` or core `v1`, whatever the resource's
/// `mode`), besides [`VARIABLES`], the same whichever API it is read through: `reason`,
/// `type` (strings) and `regarding` (a map: the `regarding`, or core `involvedObject`,
/// ObjectReference). For other kinds `reason` is `""`, `regarding` an empty map, and `type`
/// CEL's own name of the type of types (which an Event's `type` shadows).
pub const EVENT_VARIABLES: [&str; 3] = ["reason", "type", "regarding"];

/// The variables of a message's context (`[[resources]] enrich`, `owners.rs`), besides
/// [`VARIABLES`]: `owners` (a list of maps `{apiVersion, kind, name, uid}`, nearest owner
/// first, as the message's `owners`), `node` (a string, `""` when unknown), `nodeLabels`
/// and `namespaceLabels` (maps, the message's). Without `enrich` `owners` is an empty list,
/// `node` `""` and the label maps empty.
pub const CONTEXT_VARIABLES: [&str; 4] = ["owners", "node", "nodeLabels", "namespaceLabels"];

/// The values of `op` a sink's change filter sees (the message's `op`; sync markers are not
/// changes and never reach a filter).
pub const OPS: [&str; 3] = ["added", "updated", "deleted"];

/// The variables a sink's filter has besides [`VARIABLES`]: they describe the change.
pub const CHANGE_VARIABLES: [&str; 2] = ["op", "changed"];

/// The names of CEL's types, identifiers every expression may use (`type(x) == int`): the
/// standard library's types (cel-spec `langdef.md`, "Values"; the `cel` crate's
/// `Env::stdlib`).
const TYPE_NAMES: [&str; 10] = [
    "bool",
    "bytes",
    "double",
    "int",
    "list",
    "map",
    "null_type",
    "string",
    "type",
    "uint",
];

/// Where an expression filters, which decides its variables and its meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// `[[resources]] filter`: which objects kubesink follows ([`VARIABLES`]).
    Resource,
    /// `[[sinks]] filter`: which objects (or, naming `op` or `changed`, which changes) a
    /// sink gets ([`VARIABLES`] and [`CHANGE_VARIABLES`]).
    Sink,
}

/// A change as a sink's filter sees it: `op` (`"added"`, `"updated"`, `"deleted"`, the
/// message's `op`) and `changed` (the message's `changed` paths of an `updated`; empty
/// otherwise).
#[derive(Debug, Clone, Copy)]
pub struct ChangeVars<'a> {
    /// The message's `op`.
    pub op: &'a str,
    /// The message's `changed`.
    pub changed: &'a [&'a str],
}

impl<'s, 'a> Subject<'s, 'a> {
    /// `obj` of `resource` (its cluster and kind), with its `metadata` and `redacted` fields
    /// as the shaper gives them (`Shaper::filter_view`), and `change` for a change filter.
    pub fn new(
        obj: &'s RawObject<'a>,
        metadata: &'s Map<String, Value>,
        redacted: &'s dyn Fn(&str) -> bool,
        resource: &'s kubesink_core::Resource,
        change: Option<ChangeVars<'s>>,
    ) -> Self {
        Subject {
            obj,
            metadata,
            redacted,
            cluster: &resource.cluster,
            kind: &resource.kind,
            resource,
            change,
            context: None,
        }
    }

    /// The same subject with its message's context (`enrich`).
    pub fn with_context(mut self, context: Option<&'s Context>) -> Self {
        self.context = context;
        self
    }
}

/// What an expression is evaluated on: the object (decoded once), its `metadata` and the
/// top-level fields the message leaves out (`redacted`, as the shaper redacts them), the
/// cluster's name, the kind, the resource (for the log line) and, for a sink's change
/// filter, the change.
pub struct Subject<'s, 'a> {
    /// The decoded object.
    pub obj: &'s RawObject<'a>,
    /// Its `metadata` as the message carries it.
    pub metadata: &'s Map<String, Value>,
    /// Top-level fields the message leaves out.
    pub redacted: &'s dyn Fn(&str) -> bool,
    /// The cluster's name.
    pub cluster: &'s str,
    /// The resource's kind.
    pub kind: &'s str,
    /// The resource, named in the log line of an error.
    pub resource: &'s dyn std::fmt::Display,
    /// The change, for a filter that names `op` or `changed`.
    pub change: Option<ChangeVars<'s>>,
    /// The message's context (`enrich`), for a filter that names `owners` or `node`.
    pub context: Option<&'s Context>,
}

/// Why an expression does not compile: the message, and where (1-based line and column of
/// the source; `None` when the problem is the whole expression).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", match position { Some((l, c)) => format!("line {l}, column {c}: "), None => String::new() })]
pub struct CompileError {
    /// What is wrong.
    pub message: String,
    /// (line, column), 1-based.
    pub position: Option<(usize, usize)>,
}

/// What [`Filter::matches`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// The expression gave `true`.
    Yes,
    /// It gave `false`.
    No,
    /// It failed or gave no bool: taken as no match.
    Error,
}

/// A compiled resource filter; see the module docs. Shared by the resource's informers
/// (one per namespace), which count into the same error counter.
pub struct Filter {
    source: String,
    program: cel::Program,
    env: Arc<cel::Env>,
    /// The parts of `object` it can reach.
    reach: Reach,
    /// It names `op` or `changed` (a sink's change filter).
    on_changes: bool,
    /// The variables it names.
    variables: BTreeSet<String>,
    /// (variable, string literal) of each comparison of a variable with a literal.
    compared: Vec<(String, String)>,
    /// The sink whose filter it is (`None`: a resource's, or unnamed), for its log line.
    sink: Option<String>,
    place: Place,
    errors: AtomicU64,
    logged: AtomicBool,
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filter")
            .field("source", &self.source)
            .field("reach", &self.reach)
            .finish_non_exhaustive()
    }
}

impl Filter {
    /// Compiles `source` as a resource filter ([`Place::Resource`]).
    ///
    /// # Errors
    /// As [`Filter::compile_for`].
    pub fn compile(source: &str) -> Result<Filter, CompileError> {
        Filter::compile_for(source, Place::Resource)
    }

    /// Compiles `source` as a filter at `place`.
    ///
    /// # Errors
    /// [`CompileError`]: empty, longer than [`MAX_SOURCE_BYTES`], a syntax error (with its
    /// position), nested deeper than the bounds, or a variable other than those of `place`.
    pub fn compile_for(source: &str, place: Place) -> Result<Filter, CompileError> {
        let whole = |message: String| CompileError {
            message,
            position: None,
        };
        if source.trim().is_empty() {
            return Err(whole("the expression is empty".into()));
        }
        if source.len() > MAX_SOURCE_BYTES {
            return Err(whole(format!(
                "{} bytes; at most {MAX_SOURCE_BYTES}",
                source.len()
            )));
        }
        // cel's ANTLR parser descends recursively before its depth limit applies: a few
        // thousand nested parentheses (within MAX_SOURCE_BYTES) would overflow a 2 MiB
        // thread stack. It runs on a thread of its own with room for the deepest source.
        let text = source.to_owned();
        let parsed = std::thread::Builder::new()
            .name("cel-compile".into())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn(move || parse(&text))
            .map_err(|e| whole(format!("starting the CEL parser: {e}")))?
            .join()
            .map_err(|_| whole("the CEL parser failed on this expression".into()))?;
        let (env, program) = parsed?;
        let mut walk = Walk::default();
        walk.expr(program.expression(), &mut Vec::new(), 0);
        if walk.nesting > MAX_COMPREHENSION_NESTING {
            return Err(whole(format!(
                "comprehensions nested {} deep; at most {MAX_COMPREHENSION_NESTING}",
                walk.nesting
            )));
        }
        let known = |v: &str| {
            VARIABLES.contains(&v)
                || EVENT_VARIABLES.contains(&v)
                || CONTEXT_VARIABLES.contains(&v)
                || TYPE_NAMES.contains(&v)
                || (place == Place::Sink && CHANGE_VARIABLES.contains(&v))
        };
        if let Some(v) = walk.free.iter().find(|v| !known(v)) {
            let not_a_macro = walk.first_args.iter().find(|(arg, _)| arg == v);
            let hint = match (v.as_str(), not_a_macro) {
                ("op" | "changed", _) => {
                    " (a resource filter decides on the object alone: op and changed describe a change, not an object)".to_owned()
                }
                (_, Some((_, function))) => format!(
                    " (the first argument of `{function}`, which is not one of CEL's macros: all, exists, exists_one, map, filter)"
                ),
                _ => match dashed(source, v) {
                    Some(name) => format!(
                        " (`{name}` reads as a subtraction: a name is quoted, \"{name}\")"
                    ),
                    None => String::new(),
                },
            };
            let (whose, has) = match place {
                Place::Resource => (
                    "a resource filter",
                    format!(
                        "{}, {} (and for Events {})",
                        VARIABLES.join(", "),
                        CONTEXT_VARIABLES.join(", "),
                        EVENT_VARIABLES.join(", ")
                    ),
                ),
                Place::Sink => (
                    "a sink's filter",
                    format!(
                        "{}, {}, {} (and for Events {})",
                        VARIABLES.join(", "),
                        CHANGE_VARIABLES.join(", "),
                        CONTEXT_VARIABLES.join(", "),
                        EVENT_VARIABLES.join(", ")
                    ),
                ),
            };
            return Err(whole(format!(
                "unknown variable {v:?}; {whose} has {has}{hint}"
            )));
        }
        if let Some(what) = not_a_bool(program.expression()) {
            return Err(whole(format!("the expression gives {what}, never a bool")));
        }
        for (var, text) in &walk.compared {
            match var.as_str() {
                "op" if !OPS.contains(&text.as_str()) => {
                    return Err(whole(format!(
                        "op is never {text:?}: it is one of {} (lowercase, as the message's op)",
                        OPS.map(|o| format!("{o:?}")).join(", ")
                    )))
                }
                "changed" => {
                    return Err(whole(format!(
                        "changed is a list of paths, never the string {text:?}: write {text:?} in changed, or changed.exists(p, p.startsWith({text:?}))"
                    )))
                }
                _ => {}
            }
        }
        Ok(Filter {
            source: source.to_owned(),
            program,
            env,
            reach: walk.reach,
            on_changes: CHANGE_VARIABLES.iter().any(|v| walk.free.contains(*v)),
            variables: walk.free.clone(),
            compared: walk.compared.clone(),
            sink: None,
            place,
            errors: AtomicU64::new(0),
            logged: AtomicBool::new(false),
        })
    }

    /// The top-level fields of the object the expression reads other than `apiVersion`,
    /// `kind` and `metadata` (what a metadata-only watch has), in order; `["*"]` when it
    /// uses the object whole.
    pub fn reads_beyond_metadata(&self) -> Vec<String> {
        match &self.reach {
            Reach::All => vec!["*".to_owned()],
            Reach::Fields(f) => f
                .keys()
                .filter(|k| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
                .cloned()
                .collect(),
        }
    }

    /// Evaluations that failed or gave no `bool` (each a no match); the informer's
    /// `filter_errors` counts them per watch.
    #[cfg(test)]
    fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// The expression's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// `expr` as a message names it: quoted, a long one by its first 120 characters (the
    /// message must stay readable).
    pub fn shown(expr: &str) -> String {
        match expr.char_indices().nth(120) {
            Some((cut, _)) => format!("{:?}…", &expr[..cut]),
            None => format!("{expr:?}"),
        }
    }

    /// The string literals the expression compares variable `name` with (`kind == "Pod"`,
    /// `ns in ["a", "b"]`), in order.
    pub fn compared(&self, name: &str) -> Vec<&str> {
        self.compared
            .iter()
            .filter(|(v, _)| v == name)
            .map(|(_, t)| t.as_str())
            .collect()
    }

    /// The filter of sink `name`: its log line names it.
    pub fn of_sink(mut self, name: &str) -> Self {
        self.sink = Some(name.to_owned());
        self
    }

    /// Whether the expression names the variable `name` (`kind`, `ns`, …).
    pub fn uses(&self, name: &str) -> bool {
        self.variables.contains(name)
    }

    /// Whether the expression names a context variable ([`CONTEXT_VARIABLES`]).
    pub fn uses_context(&self) -> bool {
        CONTEXT_VARIABLES.iter().any(|v| self.uses(v))
    }

    /// Whether the expression names `op` or `changed`: a sink's *change filter*, which
    /// chooses changes rather than objects (see `docs/configuration.md`).
    pub fn on_changes(&self) -> bool {
        self.on_changes
    }

    /// Whether `subject` matches. An evaluation error is no match ([`Match::Error`]):
    /// counted, and logged once per filter with the resource and the object's key.
    pub fn matches(&self, subject: &Subject<'_, '_>) -> Match {
        match self.evaluate(subject) {
            Ok(true) => Match::Yes,
            Ok(false) => Match::No,
            Err(why) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                if !self.logged.swap(true, Ordering::Relaxed) {
                    let whose = match (self.place, &self.sink) {
                        (Place::Resource, _) => {
                            "the resource's filter (counted in kubesink_filter_errors_total)"
                                .to_owned()
                        }
                        (Place::Sink, Some(name)) => format!(
                            "the filter of sink {name:?} (counted in kubesink_sink_filter_errors_total)"
                        ),
                        (Place::Sink, None) => "a sink's filter".to_owned(),
                    };
                    tracing::warn!(
                        resource = %subject.resource,
                        namespace = subject.obj.namespace().unwrap_or_default(),
                        name = subject.obj.name().unwrap_or_default(),
                        filter = self.source,
                        error = %why,
                        "{whose} failed on an object: taken as no match (logged once)"
                    );
                }
                Match::Error
            }
        }
    }

    /// `object` as the expression can reach it ([`Reach`]), borrowing from `subject`.
    fn object<'s>(&self, subject: &Subject<'s, '_>) -> Result<cel_values::CelVal<'s>, String> {
        let obj = subject.obj;
        let mut object = std::collections::HashMap::new();
        let mut put = |key: &'s str, value: cel_values::CelVal<'s>| {
            object.insert(CelMapKey::from(key), value);
        };
        if let Some(a) = obj
            .api_version
            .as_deref()
            .filter(|_| self.reach.field("apiVersion").is_some())
        {
            put("apiVersion", string(a));
        }
        if let Some(k) = obj
            .kind
            .as_deref()
            .filter(|_| self.reach.field("kind").is_some())
        {
            put("kind", string(k));
        }
        if let Some(reach) = self.reach.field("metadata") {
            put(
                "metadata",
                cel_values::from_json_map(subject.metadata, reach),
            );
        }
        for (key, raw) in &obj.body {
            if let Some(reach) = self.reach.field(key).filter(|_| !(subject.redacted)(key)) {
                let v = cel_values::from_raw(raw.get(), reach)
                    .map_err(|e| format!("field {key:?} does not parse: {e}"))?;
                put(key, v);
            }
        }
        Ok(Box::new(CelMap::from(object)))
    }

    fn evaluate<'s>(&self, subject: &Subject<'s, '_>) -> Result<bool, String> {
        let obj = subject.obj;
        // Only the variables the expression names (each is a map entry and a box).
        let mut ctx = cel::Context::with_env(self.env.clone());
        if self.uses("object") {
            ctx.add_variable_as_val("object", self.object(subject)?);
        }
        if self.uses("cluster") {
            ctx.add_variable_as_val("cluster", string(subject.cluster));
        }
        if self.uses("kind") {
            ctx.add_variable_as_val("kind", string(subject.kind));
        }
        if self.uses("ns") {
            ctx.add_variable_as_val("ns", string(obj.namespace().unwrap_or_default()));
        }
        for (var, fields) in [
            ("reason", &["reason"][..]),
            ("type", &["type"]),
            ("regarding", &["regarding", "involvedObject"]),
        ] {
            // Off Events, `type` stays CEL's name of the type of types (`type(x) == type`).
            if !self.uses(var) || (var == "type" && subject.kind != "Event") {
                continue;
            }
            let raw = (subject.kind == "Event")
                .then(|| obj.body.iter().find(|(k, _)| fields.contains(&k.as_ref())))
                .flatten()
                .map(|(_, raw)| raw.get())
                .filter(|raw| *raw != "null");
            let value = match (raw, var) {
                (Some(raw), _) => {
                    cel_values::from_raw(raw, &Reach::All).map_err(|e| format!("{var}: {e}"))?
                }
                (None, "regarding") => Box::new(CelMap::from(std::collections::HashMap::<
                    CelMapKey,
                    cel_values::CelVal<'_>,
                >::new())),
                (None, _) => string(""),
            };
            ctx.add_variable_as_val(var, value);
        }
        if self.uses("owners") {
            let owners = subject
                .context
                .and_then(|c| c.owners.as_deref())
                .unwrap_or_default()
                .iter()
                .map(|o| {
                    let fields = [
                        ("apiVersion", &o.api_version),
                        ("kind", &o.kind),
                        ("name", &o.name),
                        ("uid", &o.uid),
                    ]
                    .into_iter()
                    .map(|(k, v)| (CelMapKey::from(k), string(v)))
                    .collect::<std::collections::HashMap<_, _>>();
                    Box::new(CelMap::from(fields)) as cel_values::CelVal<'_>
                })
                .collect::<Vec<_>>();
            ctx.add_variable_as_val("owners", Box::new(CelList::from(owners)));
        }
        for (var, labels) in [
            (
                "namespaceLabels",
                subject.context.and_then(|c| c.namespace_labels.as_deref()),
            ),
            (
                "nodeLabels",
                subject.context.and_then(|c| c.node_labels.as_deref()),
            ),
        ] {
            if !self.uses(var) {
                continue;
            }
            let labels = labels
                .unwrap_or_default()
                .iter()
                .map(|(k, v)| (CelMapKey::from(&**k), string(v)))
                .collect::<std::collections::HashMap<_, _>>();
            ctx.add_variable_as_val(var, Box::new(CelMap::from(labels)));
        }
        if self.uses("node") {
            let node = subject.context.and_then(|c| c.node.as_deref());
            ctx.add_variable_as_val("node", string(node.unwrap_or_default()));
        }
        if self.on_changes {
            let change = subject.change.unwrap_or(ChangeVars {
                op: "",
                changed: &[],
            });
            ctx.add_variable_as_val("op", string(change.op));
            ctx.add_variable_as_val(
                "changed",
                Box::new(CelList::from(
                    change.changed.iter().map(|p| string(p)).collect::<Vec<_>>(),
                )),
            );
        }
        match self.program.execute(&ctx) {
            Ok(cel::Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!("gave {other:?}, not a bool")),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// What the expression's root gives when it can be told without types and is not a bool: a
/// literal, a list or map, arithmetic. A field, a variable or a function may be a bool.
fn not_a_bool(e: &IdedExpr) -> Option<&'static str> {
    use cel::common::ast::operators;
    match &e.expr {
        Expr::Literal(LiteralValue::Boolean(_)) => None,
        Expr::Literal(LiteralValue::Null) => Some("null"),
        Expr::Literal(LiteralValue::String(_)) => Some("a string"),
        Expr::Literal(LiteralValue::Bytes(_)) => Some("bytes"),
        Expr::Literal(_) => Some("a number"),
        Expr::List(_) => Some("a list"),
        Expr::Map(_) | Expr::Struct(_) => Some("a map"),
        Expr::Call(c)
            if [
                operators::ADD,
                operators::SUBSTRACT,
                operators::MULTIPLY,
                operators::DIVIDE,
                operators::MODULO,
                operators::NEGATE,
            ]
            .contains(&c.func_name.as_str()) =>
        {
            Some("the result of arithmetic")
        }
        _ => None,
    }
}

/// Parses and compiles `source` with the standard library and the strings and lists
/// extensions, nested at most [`MAX_DEPTH`] deep.
fn parse(source: &str) -> Result<(Arc<cel::Env>, cel::Program), CompileError> {
    let whole = |message: String| CompileError {
        message,
        position: None,
    };
    let mut env = cel::Env::stdlib();
    for (name, ext) in [
        (
            "strings",
            cel::extensions::strings as fn(&mut cel::Env) -> _,
        ),
        ("lists", cel::extensions::lists),
    ] {
        env.add_extension(ext)
            .map_err(|e| whole(format!("the CEL {name} extension: {e}")))?;
    }
    let env = Arc::new(env);
    let parsed = env
        .parser()
        .max_recursion_depth(MAX_DEPTH)
        .parse_with_source_info(source);
    let program = match parsed {
        Ok(_) => env.compile(source),
        Err(e) => Err(e),
    }
    .map_err(|errors| {
        let first = errors.errors.first();
        let mut message = first.map_or_else(|| errors.to_string(), |e| e.msg.clone());
        let mut position = first
            .filter(|e| e.pos.0 >= 1 && e.pos.1 >= 1)
            .map(|e| (e.pos.0 as usize, e.pos.1 as usize));
        if message.contains("token recognition error at: '= '")
            || message.contains("token recognition error at: '='")
        {
            message += " (CEL compares with ==, not =)";
        }
        // `ns in ("a", "b")`: CEL has no tuples; a list is written in brackets.
        let tuple = source.match_indices("in").any(|(at, _)| {
            let before = source[..at].chars().next_back();
            let after = source[at + 2..].trim_start();
            !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
                && after.starts_with('(')
        });
        if tuple {
            message += " (a list is written in brackets: ns in [\"a\", \"b\"])";
        }
        if message.ends_with("reserved identifier: namespace") {
            message +=
                " (CEL reserves the word: the namespace is `ns`, or `object.metadata.namespace`)";
        }
        // cel's depth limit surfaces as its parser's internal error value.
        if message.contains("Recursion limit") {
            message = format!("nested deeper than {MAX_DEPTH} levels");
            position = None;
        }
        CompileError { message, position }
    })?;
    Ok((env, program))
}

/// The word of `source` that holds `v` beside a `-` (`team-a` for `a` or `team`), when there
/// is one: an unquoted name with a dash, which CEL reads as a subtraction.
fn dashed<'a>(source: &'a str, v: &str) -> Option<&'a str> {
    source
        .split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
        .map(|w| w.trim_matches('-'))
        .find(|w| w.contains('-') && w.split('-').any(|part| part == v))
}

/// The compiled expression's free variables, the object's top-level fields it reaches, and
/// its comprehension nesting.
#[derive(Default)]
struct Walk {
    free: BTreeSet<String>,
    /// (identifier, function) of each member call whose first argument is a bare identifier:
    /// `list.any(c, …)` when `any` is not a macro leaves `c` free.
    first_args: Vec<(String, String)>,
    /// The parts of `object` it reaches.
    reach: Reach,
    nesting: usize,
    /// (variable, string literal) of each comparison of a free variable with a literal.
    compared: Vec<(String, String)>,
}

impl Walk {
    /// Notes a free variable compared with string literals: `v == "x"`, `"x" != v`,
    /// `v in ["x", "y"]` (what [`Filter::compared`] answers and `compile` checks).
    fn note_comparison(&mut self, c: &cel::common::ast::CallExpr, bound: &[String]) {
        use cel::common::ast::operators::{EQUALS, IN, NOT_EQUALS};
        let var = |e: &IdedExpr| match &e.expr {
            Expr::Ident(n) if !bound.contains(n) => Some(n.clone()),
            _ => None,
        };
        let text = |e: &IdedExpr| match &e.expr {
            Expr::Literal(LiteralValue::String(s)) => Some(s.inner().to_owned()),
            _ => None,
        };
        let [a, b] = c.args.as_slice() else { return };
        let pairs: Vec<(String, String)> = match c.func_name.as_str() {
            EQUALS | NOT_EQUALS => match (var(a), text(b), var(b), text(a)) {
                (Some(v), Some(t), _, _) | (_, _, Some(v), Some(t)) => vec![(v, t)],
                _ => Vec::new(),
            },
            IN => match (var(a), &b.expr) {
                (Some(v), Expr::List(l)) => l
                    .elements
                    .iter()
                    .filter_map(|e| text(e).map(|t| (v.clone(), t)))
                    .collect(),
                _ => Vec::new(),
            },
            _ => Vec::new(),
        };
        self.compared.extend(pairs);
    }

    /// `bound`: the comprehension variables in scope; `depth`: comprehensions around.
    fn expr(&mut self, e: &IdedExpr, bound: &mut Vec<String>, depth: usize) {
        if let Some(path) = object_path(e, bound) {
            self.free.insert("object".into());
            self.reach.add(&path);
            return;
        }
        match &e.expr {
            Expr::Unspecified | Expr::Literal(_) => {}
            Expr::Ident(name) => {
                if !name.starts_with('@') && !bound.iter().any(|b| b == name) {
                    self.free.insert(name.clone());
                }
            }
            Expr::Select(s) => self.expr(&s.operand, bound, depth),
            Expr::Call(c) => {
                self.note_comparison(c, bound);
                if let (Some(_), Some(Expr::Ident(first))) =
                    (&c.target, c.args.first().map(|a| &a.expr))
                {
                    self.first_args.push((first.clone(), c.func_name.clone()));
                }
                if let Some(t) = &c.target {
                    self.expr(t, bound, depth);
                }
                for a in &c.args {
                    self.expr(a, bound, depth);
                }
            }
            Expr::Comprehension(c) => {
                self.nesting = self.nesting.max(depth + 1);
                self.expr(&c.iter_range, bound, depth);
                self.expr(&c.accu_init, bound, depth);
                let added = 2 + usize::from(c.iter_var2.is_some());
                bound.push(c.iter_var.clone());
                bound.push(c.accu_var.clone());
                if let Some(v) = &c.iter_var2 {
                    bound.push(v.clone());
                }
                self.expr(&c.loop_cond, bound, depth + 1);
                self.expr(&c.loop_step, bound, depth + 1);
                self.expr(&c.result, bound, depth + 1);
                bound.truncate(bound.len() - added);
            }
            Expr::List(l) => {
                for x in &l.elements {
                    self.expr(x, bound, depth);
                }
            }
            Expr::Map(cel::common::ast::MapExpr { entries, .. })
            | Expr::Struct(cel::common::ast::StructExpr { entries, .. }) => {
                for entry in entries {
                    match &entry.expr {
                        EntryExpr::StructField(f) => self.expr(&f.value, bound, depth),
                        EntryExpr::MapEntry(me) => {
                            self.expr(&me.key, bound, depth);
                            self.expr(&me.value, bound, depth);
                        }
                    }
                }
            }
        }
    }
}

/// The path `e` reads when it is the free variable `object` followed by field selections
/// (`.f`, `["f"]`, `has(….f)`): `object.status.phase` is `["status", "phase"]`.
fn object_path(e: &IdedExpr, bound: &[String]) -> Option<Vec<String>> {
    match &e.expr {
        Expr::Ident(n) if n == "object" && !bound.iter().any(|b| b == "object") => Some(Vec::new()),
        Expr::Select(s) => {
            let mut path = object_path(&s.operand, bound)?;
            path.push(s.field.clone());
            Some(path)
        }
        Expr::Call(c)
            if c.func_name == cel::common::ast::operators::INDEX
                && c.target.is_none()
                && c.args.len() == 2 =>
        {
            let Expr::Literal(LiteralValue::String(field)) = &c.args[1].expr else {
                return None;
            };
            let mut path = object_path(&c.args[0], bound)?;
            path.push(field.inner().to_owned());
            Some(path)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: &str) -> String {
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"web-1","namespace":"payments","labels":{{"team":"pay"}}}},"spec":{{"containers":[{{"name":"app","image":"nginx:1.27"}}]}},"status":{{"phase":"{phase}"}}}}"#
        )
    }

    #[test]
    fn cel_type_names_are_not_unknown_variables() {
        let running = pod("Running");
        for expr in [
            "type(object.status.phase) == string",
            "type(object.metadata.labels) == map",
            "type(object.spec.containers) == list",
            "type(1u) == uint && type(1) == int && type(1.0) == double",
            "type(true) == bool && type(null) == null_type && type(int) == type",
        ] {
            assert_eq!(eval(expr, &running), (true, 0), "{expr}");
        }
        assert_eq!(
            eval("type(object.status.phase) == int", &running),
            (false, 0)
        );
    }

    #[test]
    fn events_have_reason_type_and_regarding_whichever_api_they_come_from() {
        let api = r#"{"apiVersion":"events.k8s.io/v1","kind":"Event","metadata":{"name":"e","namespace":"kube-system"},
            "reason":"BackOff","type":"Warning","regarding":{"kind":"Pod","name":"coredns-1","namespace":"kube-system"}}"#;
        let core = r#"{"apiVersion":"v1","kind":"Event","metadata":{"name":"e","namespace":"kube-system"},
            "reason":"BackOff","type":"Warning","involvedObject":{"kind":"Pod","name":"coredns-1","namespace":"kube-system"}}"#;
        let normal = r#"{"apiVersion":"v1","kind":"Event","metadata":{"name":"e","namespace":"default"},
            "reason":"Scheduled","type":"Normal","involvedObject":{"kind":"Pod","name":"web-1"}}"#;
        let event = |expr: &str, json: &str| {
            let f = Filter::compile(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
            let obj = RawObject::parse(json).expect("object");
            let mut s = subject(&obj, &|_| false, None);
            s.kind = "Event";
            (f.matches(&s) == Match::Yes, f.errors())
        };
        let warnings = r#"type == "Warning" && ns == "kube-system" && regarding.kind == "Pod" && reason.startsWith("Back")"#;
        assert_eq!(event(warnings, api), (true, 0));
        assert_eq!(event(warnings, core), (true, 0));
        assert_eq!(event(warnings, normal), (false, 0));
        assert_eq!(event(r#"regarding.name == "web-1""#, normal), (true, 0));
        // Off Events: reason empty, regarding empty, type CEL's own.
        assert_eq!(
            eval(r#"reason == "" && size(regarding) == 0"#, &pod("Running")),
            (true, 0)
        );
        assert_eq!(eval("type(int) == type", &pod("Running")), (true, 0));
    }

    fn eval(expr: &str, json: &str) -> (bool, u64) {
        let f = Filter::compile(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
        let obj = RawObject::parse(json).expect("object");
        let m = f.matches(&subject(&obj, &|_| false, None));
        (m == Match::Yes, f.errors())
    }

    fn subject<'s, 'a>(
        obj: &'s RawObject<'a>,
        redacted: &'s dyn Fn(&str) -> bool,
        change: Option<ChangeVars<'s>>,
    ) -> Subject<'s, 'a> {
        Subject {
            obj,
            metadata: &obj.metadata,
            redacted,
            cluster: "prod",
            kind: "Pod",
            resource: &"v1 Pod",
            change,
            context: None,
        }
    }

    #[test]
    fn a_filter_reads_the_context_of_its_message() {
        use kubesink_core::message::OwnerRef;
        let running = pod("Running");
        let obj = RawObject::parse(&running).expect("object");
        let f = Filter::compile(
            r#"owners.exists(o, o.kind == "Deployment" && o.name == "web") && node == "node-a""#,
        )
        .expect("compiles");
        assert!(f.uses_context());
        let owner = |kind: &str, name: &str| OwnerRef {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: "u".into(),
        };
        let context = Context {
            owners: Some(vec![
                owner("ReplicaSet", "web-7d9f"),
                owner("Deployment", "web"),
            ]),
            owners_complete: true,
            node: Some("node-a".into()),
            namespace_labels: Some(vec![("team".into(), "pay".into())]),
            node_labels: Some(vec![("topology.kubernetes.io/zone".into(), "eu-1a".into())]),
        };
        let zone = Filter::compile(r#"nodeLabels["topology.kubernetes.io/zone"] == "eu-1a""#)
            .expect("compiles");
        assert_eq!(
            zone.matches(&subject(&obj, &|_| false, None).with_context(Some(&context))),
            Match::Yes
        );
        let on = |c: Option<&Context>| f.matches(&subject(&obj, &|_| false, None).with_context(c));
        assert_eq!(on(Some(&context)), Match::Yes);
        let team = Filter::compile(r#"namespaceLabels.team == "pay""#).expect("compiles");
        let on_team =
            |c: Option<&Context>| team.matches(&subject(&obj, &|_| false, None).with_context(c));
        assert_eq!(on_team(Some(&context)), Match::Yes);
        // Without the label (or without a context) the field is absent: an error, no match.
        assert_eq!(on_team(None), Match::Error);
        let elsewhere = Context {
            node: Some("node-b".into()),
            ..context.clone()
        };
        assert_eq!(on(Some(&elsewhere)), Match::No);
        // Without a context (no `enrich`): owners is empty, node "".
        assert_eq!(on(None), Match::No);
        let empty = Filter::compile(r#"size(owners) == 0 && node == """#).expect("compiles");
        assert_eq!(empty.matches(&subject(&obj, &|_| false, None)), Match::Yes);
        assert!(!Filter::compile(r#"ns == "a""#)
            .expect("compiles")
            .uses_context());
    }

    #[test]
    fn a_sink_filter_may_choose_changes_by_op_and_changed() {
        let running = pod("Running");
        let obj = RawObject::parse(&running).expect("object");
        let spec = Filter::compile_for(
            r#"op != "updated" || changed.exists(p, p.startsWith("spec"))"#,
            Place::Sink,
        )
        .expect("compiles");
        assert!(spec.on_changes());
        let m = |op, changed: &[&str]| {
            spec.matches(&subject(&obj, &|_| false, Some(ChangeVars { op, changed })))
        };
        assert_eq!(m("updated", &["status"]), Match::No);
        assert_eq!(m("updated", &["status", "spec.containers"]), Match::Yes);
        assert_eq!(m("added", &[]), Match::Yes);
        assert_eq!(m("deleted", &[]), Match::Yes);
        // Without op or changed a sink's filter chooses objects, as a resource's does.
        let objects = Filter::compile_for(r#"ns == "payments""#, Place::Sink).expect("compiles");
        assert!(!objects.on_changes());
        // A resource filter has no op: it decides on the object alone.
        let e = Filter::compile(r#"op == "added""#).expect_err("no op");
        assert!(
            e.message
                .contains("a resource filter has object, cluster, kind, ns"),
            "{e}"
        );
        let e = Filter::compile_for(r#"op == "Deleted""#, Place::Sink).expect_err("no such op");
        assert!(
            e.message
                .contains(r#"op is never "Deleted": it is one of "added", "updated", "deleted""#),
            "{e}"
        );
        let e = Filter::compile_for(r#"op in ["added", "modified"]"#, Place::Sink)
            .expect_err("no such op");
        assert!(e.message.contains(r#"op is never "modified""#), "{e}");
        let e = Filter::compile_for(r#"changed == "spec""#, Place::Sink).expect_err("a list");
        assert!(e.message.contains(r#"write "spec" in changed"#), "{e}");
        let f =
            Filter::compile_for(r#"kind == "Pod" || "Secret" == kind"#, Place::Sink).expect("ok");
        assert_eq!(f.compared("kind"), ["Pod", "Secret"]);
        let e = Filter::compile(r#"kind = "Pod""#).expect_err("=");
        assert!(e.message.contains("CEL compares with =="), "{e}");
        let e = Filter::compile_for("opp == 1", Place::Sink).expect_err("unknown");
        assert!(
            e.message
                .contains("a sink's filter has object, cluster, kind, ns, op, changed"),
            "{e}"
        );
    }

    #[test]
    fn the_common_wishes_match_as_written() {
        let running = pod("Running");
        let done = pod("Succeeded");
        let drop_completed =
            r#"!(has(object.status.phase) && object.status.phase in ["Succeeded", "Failed"])"#;
        assert_eq!(eval(drop_completed, &running), (true, 0));
        assert_eq!(eval(drop_completed, &done), (false, 0));
        assert_eq!(
            eval(r#"ns in ["payments", "billing"]"#, &running),
            (true, 0)
        );
        assert_eq!(eval(r#"ns.startsWith("kube-")"#, &running), (false, 0));
        assert_eq!(
            eval(
                r#"object.spec.containers.exists(c, c.image.startsWith("nginx"))"#,
                &running
            ),
            (true, 0)
        );
        assert_eq!(
            eval(
                r#"object.metadata.labels["team"] == "pay" && cluster == "prod" && kind == "Pod""#,
                &running
            ),
            (true, 0)
        );
        assert_eq!(
            eval(
                r#"object["status"]["phase"].lowerAscii() == "running""#,
                &running
            ),
            (true, 0)
        );
    }

    #[test]
    fn a_run_time_error_is_no_match_and_counted() {
        // A missing field, a type mismatch, a result that is not a bool.
        assert_eq!(
            eval("object.status.nodeName == 'a'", &pod("Running")),
            (false, 1)
        );
        assert_eq!(
            eval("object.status.phase + 1 == 2", &pod("Running")),
            (false, 1)
        );
        assert_eq!(eval("object.status.phase", &pod("Running")), (false, 1));
    }

    #[test]
    fn compile_errors_name_the_position_and_unknown_variables() {
        let e = Filter::compile("object.status.phase ==").expect_err("syntax");
        assert_eq!(e.position.map(|p| p.0), Some(1), "{e}");
        assert!(e.to_string().starts_with("line 1, column "), "{e}");
        let e = Filter::compile("object.status.phase ==").expect_err("syntax");
        assert_eq!(
            e.position,
            Some((1, 23)),
            "the end of the source, 1-based: {e}"
        );
        let e = Filter::compile(&format!("{}true{}", "(".repeat(40), ")".repeat(40)))
            .expect_err("deep");
        assert_eq!(
            e.to_string(),
            format!("nested deeper than {MAX_DEPTH} levels")
        );
        for (expr, what) in [
            ("1 + 2", "the result of arithmetic"),
            ("'yes'", "a string"),
            ("[true]", "a list"),
            ("3", "a number"),
        ] {
            let e = Filter::compile(expr).expect_err(expr);
            assert!(e.to_string().contains(what), "{expr}: {e}");
        }
        let e = Filter::compile("object.spec.containers.any(c, c.name == 'a')").expect_err("any");
        assert!(
            e.to_string()
                .contains("`any`, which is not one of CEL's macros"),
            "{e}"
        );
        let e = Filter::compile("namespace == 'a'").expect_err("reserved");
        assert!(e.to_string().contains("the namespace is `ns`"), "{e}");
        let e = Filter::compile("op == 'added'").expect_err("op");
        assert!(e.to_string().contains("unknown variable \"op\""), "{e}");
        assert!(
            e.to_string().contains("describe a change, not an object"),
            "{e}"
        );
        let e = Filter::compile("ns == team-a").expect_err("unquoted");
        assert!(
            e.to_string()
                .contains("`team-a` reads as a subtraction: a name is quoted, \"team-a\""),
            "{e}"
        );
        let e = Filter::compile(r#"ns in ("a", "b")"#).expect_err("a tuple");
        assert!(
            e.to_string()
                .contains(r#"a list is written in brackets: ns in ["a", "b"]"#),
            "{e}"
        );
        assert!(Filter::compile(r#"ns in ["a", "b"]"#).is_ok());
        let e = Filter::compile("objct.metadata.name == 'a'").expect_err("typo");
        assert!(e.to_string().contains("\"objct\""), "{e}");
        assert!(Filter::compile(" ").is_err());
        assert!(Filter::compile(&"1 + ".repeat(2000)).is_err());
        let deep = format!("{}true{}", "(".repeat(100), ")".repeat(100));
        assert!(
            Filter::compile(&deep).is_err(),
            "nested deeper than MAX_DEPTH"
        );
        // As deep as the source bound allows: an error, not a stack overflow.
        let n = (MAX_SOURCE_BYTES - 4) / 2;
        let deepest = format!("{}true{}", "(".repeat(n), ")".repeat(n));
        assert!(Filter::compile(&deepest).is_err());
        // cel folds a run of `!` (by its parity): no recursion, no limit needed.
        let unary = format!("{}true", "!".repeat(MAX_SOURCE_BYTES - 5));
        assert_eq!(eval(&unary, &pod("Running")), (false, 0));
        let nested = "[[[1]]].all(a, a.all(b, b.all(c, c > 0)))";
        let e = Filter::compile(nested).expect_err("three comprehensions");
        assert!(e.to_string().contains("nested 3 deep"), "{e}");
        // Comprehension variables are not free variables.
        assert!(Filter::compile("object.spec.containers.all(c, c.name != '')").is_ok());
    }

    /// The [`Reach`] of the paths given, each reached whole.
    fn reach(paths: &[&str]) -> Reach {
        let mut r = Reach::default();
        for p in paths {
            r.add(&p.split('.').map(str::to_owned).collect::<Vec<_>>());
        }
        r
    }

    #[test]
    fn only_the_paths_the_expression_reaches_are_built() {
        let f =
            Filter::compile("object.metadata.name == 'a' && has(object.status.phase)").expect("ok");
        assert_eq!(f.reach, reach(&["metadata.name", "status.phase"]));
        let f = Filter::compile("object['spec'].nodeName == 'n'").expect("ok");
        assert_eq!(f.reach, reach(&["spec.nodeName"]));
        let f = Filter::compile(
            "object.metadata.labels[ns] == 'x' && object.spec.containers.all(c, c.image != '')",
        )
        .expect("ok");
        assert_eq!(
            f.reach,
            reach(&["metadata.labels", "spec.containers"]),
            "indexed by a variable or iterated: reached whole"
        );
        let f =
            Filter::compile("object.status.phase == 'a' || object.status.size() > 1").expect("ok");
        assert_eq!(
            f.reach,
            reach(&["status"]),
            "a value passed to a function is reached whole"
        );
        let f = Filter::compile("size(object) > 2").expect("ok");
        assert_eq!(f.reach, Reach::All);
        let f = Filter::compile("[1].all(object, object > 0)").expect("ok");
        assert_eq!(f.reach, Reach::default(), "a bound name is not the object");
    }

    /// Every filter decides alike on the pruned values and on the whole object as cel's
    /// serde conversion makes it (the values before this module), on a real Pod: numbers of
    /// each kind, nulls, escapes, lists, labels.
    #[test]
    fn the_pruned_values_decide_as_the_whole_object_does() {
        let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-1","namespace":"payments","labels":{"team":"pay","tier":"fr\u00f6nt"},"generation":3,"deletionGracePeriodSeconds":-1},"spec":{"priority":0,"overhead":null,"containers":[{"name":"app","image":"nginx:1.27","ports":[{"containerPort":8080}]}],"weight":1.5},"status":{"phase":"Running","podIPs":[{"ip":"10.0.0.1"}],"startTime":"2026-12-01T00:00:00Z"}}"#;
        let exprs = [
            "object.status.phase == 'Running'",
            "has(object.status.phase) && object.status.phase in ['Succeeded', 'Failed']",
            "object.metadata.labels.tier == 'fr\\u00f6nt'",
            "object.metadata.labels['team'] == 'pay'",
            "object.metadata.generation == 3u",
            // Arithmetic has no mixed overloads: these tell uint, int and double apart.
            "object.metadata.generation + 1u == 4u",
            "object.metadata.deletionGracePeriodSeconds + 1 == 0",
            "object.spec.weight + 0.5 == 2.0",
            "object.spec.containers[0].ports[0].containerPort + 1u == 8081u",
            "object.metadata.generation == 3",
            "object.metadata.deletionGracePeriodSeconds == -1",
            "object.spec.priority == 0u",
            "object.spec.overhead == null",
            "object.spec.weight > 1.0",
            "object.spec.containers.all(c, c.image.startsWith('nginx'))",
            "object.spec.containers[0].ports[0].containerPort == 8080u",
            "object.status.podIPs.exists(p, p.ip == '10.0.0.1')",
            "has(object.spec.nodeName)",
            "object.spec.nodeName == 'n'",
            "object.status.phase.size() == 7 && object.status.size() == 3",
            "size(object) == 5",
            "object.kind == 'Pod' && object.apiVersion == 'v1'",
            "object.metadata.labels.size() == 2",
            "object.metadata.missing.x == 1",
        ];
        let obj = RawObject::parse(pod).expect("object");
        let whole: Value = serde_json::from_str(pod).expect("json");
        for expr in exprs {
            let f = Filter::compile(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
            let pruned = f.evaluate(&subject(&obj, &|_| false, None));
            let mut ctx = cel::Context::with_env(f.env.clone());
            ctx.add_variable("object", &whole).expect("object");
            ctx.add_variable_from_value("cluster", "prod");
            ctx.add_variable_from_value("kind", "Pod");
            ctx.add_variable_from_value("ns", "payments");
            let before = match f.program.execute(&ctx) {
                Ok(cel::Value::Bool(b)) => Ok(b),
                Ok(other) => Err(format!("{other:?}")),
                Err(e) => Err(e.to_string()),
            };
            assert_eq!(
                pruned.is_ok(),
                before.is_ok(),
                "{expr}: {pruned:?} against {before:?}"
            );
            if let (Ok(a), Ok(b)) = (&pruned, &before) {
                assert_eq!(a, b, "{expr}");
            }
        }
    }

    #[test]
    fn redacted_fields_are_not_seen() {
        let secret = r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"a"},"data":{"k":"c2VjcmV0"}}"#;
        let f = Filter::compile("has(object.data)").expect("ok");
        let obj = RawObject::parse(secret).expect("object");
        let redact = |k: &str| k == "data" || k == "stringData";
        let seen = |redact: &dyn Fn(&str) -> bool| f.matches(&subject(&obj, redact, None));
        assert_eq!(seen(&redact), Match::No);
        assert_eq!(seen(&|_| false), Match::Yes);
    }
}
