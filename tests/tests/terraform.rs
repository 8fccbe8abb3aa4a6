//! Static checks of the Terraform under `terraform/`, for machines without a `terraform` binary
//! (where one exists, `terraform validate` is the stronger check; docs/deploy.md has the
//! commands). Every `.tf` file is parsed with hcl-rs's parser, and each module directory is
//! checked for:
//!
//! - references: every `var.X`, `local.X`, `module.X` (and `module.X.OUTPUT` of a local module),
//!   `data.T.N` and resource `T.N` is declared in that module;
//! - module calls: every input a `module` block passes is a variable of the called module, and
//!   every variable of it without a default is passed;
//! - outputs: each has a description and a value that references something declared;
//! - variables: each has a type and a description, and each validation refers to its own
//!   variable only (Terraform before 1.9 refuses anything else);
//! - providers: a `terraform` block with `required_version`, and a `required_providers` entry
//!   with a source and a version constraint that has an upper bound for every provider used;
//! - files: every `file()`, `filebase64()` and `templatefile()` path exists, and each
//!   `templatefile()` passes exactly the variables its template uses.
//!
//! Problems are reported as `path:line: what`. Separate tests check that the bucket module
//! applies the settings `silt bucket settings` prints, and that the systemd units in `deploy/`
//! use flags the binary has and variables their environment files set.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use hcl::edit::expr::{Expression, ForExpr, FuncCall, ObjectKey, TraversalOperator};
use hcl::edit::structure::{Attribute, Block, Body, Structure};
use hcl::edit::template::{Element, ForTemplateExpr};
use hcl::edit::visit::{self, Visit};
use hcl::edit::Span;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root").to_path_buf()
}

// ---------------------------------------------------------------------------------------------
// Parsing

struct TfFile {
    /// Path shown in messages (relative to the checked tree's parent when possible).
    shown: String,
    text: String,
    body: Body,
}

impl TfFile {
    fn line(&self, span: Option<std::ops::Range<usize>>) -> usize {
        span.map_or(0, |s| self.text[..s.start.min(self.text.len())].matches('\n').count() + 1)
    }

    fn at(&self, span: Option<std::ops::Range<usize>>) -> String {
        format!("{}:{}", self.shown, self.line(span))
    }
}

/// One Terraform module: the `.tf` files of one directory.
struct Module {
    dir: PathBuf,
    files: Vec<TfFile>,
}

fn tf_files_by_dir(root: &Path, out: &mut BTreeMap<PathBuf, Vec<PathBuf>>) {
    let mut entries: Vec<_> =
        std::fs::read_dir(root).expect("read terraform dir").map(|e| e.expect("dir entry").path()).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.is_dir() {
            if !name.starts_with('.') {
                tf_files_by_dir(&path, out);
            }
        } else if name.ends_with(".tf") {
            out.entry(root.to_path_buf()).or_default().push(path);
        }
    }
}

/// Parses every `.tf` file under `root`; parse errors go to `problems`.
fn load_modules(root: &Path, problems: &mut Vec<String>) -> BTreeMap<PathBuf, Module> {
    let base = root.parent().unwrap_or(root);
    let mut by_dir = BTreeMap::new();
    tf_files_by_dir(root, &mut by_dir);
    let mut modules = BTreeMap::new();
    for (dir, paths) in by_dir {
        let mut files = Vec::new();
        for path in paths {
            let shown = path.strip_prefix(base).unwrap_or(&path).display().to_string();
            let text = std::fs::read_to_string(&path).expect("read .tf file");
            match hcl::edit::parser::parse_body(&text) {
                Ok(body) => files.push(TfFile { shown, text, body }),
                Err(e) => problems.push(format!(
                    "{shown}:{}: does not parse as HCL: {}",
                    e.location().line(),
                    e.message()
                )),
            }
        }
        let dir = dir.canonicalize().expect("canonical module dir");
        modules.insert(dir.clone(), Module { dir, files });
    }
    modules
}

fn labels(block: &Block) -> Vec<&str> {
    block.labels.iter().map(|l| l.as_str()).collect()
}

fn attr<'a>(body: &'a Body, key: &str) -> Option<&'a Attribute> {
    body.get_attribute(key)
}

fn blocks<'a>(body: &'a Body, ident: &str) -> Vec<&'a Block> {
    body.blocks().filter(|b| b.ident.as_str() == ident).collect()
}

fn string_literal(expr: &Expression) -> Option<&str> {
    match expr {
        Expression::String(s) => Some(s.as_str()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// References

/// A reference such as `var.name`, `aws_s3_bucket.this.arn` or a bare `node_id` in a template.
#[derive(Debug, Clone)]
struct Ref {
    root: String,
    /// The attribute names right after the root, up to the first index or splat.
    attrs: Vec<String>,
    span: Option<std::ops::Range<usize>>,
}

/// Collects references, leaving out the iterator names of `for` expressions in their scope.
#[derive(Default)]
struct RefCollector {
    refs: Vec<Ref>,
    scope: Vec<String>,
    calls: Vec<FuncCall>,
}

impl RefCollector {
    fn in_scope(&self, name: &str) -> bool {
        self.scope.iter().any(|s| s == name)
    }
}

impl Visit for RefCollector {
    fn visit_expr(&mut self, expr: &Expression) {
        match expr {
            Expression::Traversal(t) => {
                if let Expression::Variable(root) = &t.expr {
                    if !self.in_scope(root.as_str()) {
                        let attrs = t
                            .operators
                            .iter()
                            .map_while(|op| match op.value() {
                                TraversalOperator::GetAttr(name) => Some(name.as_str().to_string()),
                                _ => None,
                            })
                            .collect();
                        self.refs.push(Ref { root: root.as_str().to_string(), attrs, span: t.span() });
                    }
                    for op in &t.operators {
                        visit::visit_traversal_operator(self, op);
                    }
                } else {
                    visit::visit_expr(self, expr);
                }
            }
            Expression::Variable(v) => {
                if !self.in_scope(v.as_str()) {
                    self.refs.push(Ref { root: v.as_str().to_string(), attrs: Vec::new(), span: v.span() });
                }
            }
            Expression::FuncCall(call) => {
                self.calls.push((**call).clone());
                visit::visit_expr(self, expr);
            }
            _ => visit::visit_expr(self, expr),
        }
    }

    fn visit_for_expr(&mut self, node: &ForExpr) {
        self.visit_expr(&node.intro.collection_expr);
        let before = self.scope.len();
        if let Some(k) = &node.intro.key_var {
            self.scope.push(k.as_str().to_string());
        }
        self.scope.push(node.intro.value_var.as_str().to_string());
        if let Some(k) = &node.key_expr {
            self.visit_expr(k);
        }
        self.visit_expr(&node.value_expr);
        if let Some(c) = &node.cond {
            self.visit_expr(&c.expr);
        }
        self.scope.truncate(before);
    }

    fn visit_for_template_expr(&mut self, node: &ForTemplateExpr) {
        self.visit_expr(&node.collection_expr);
        let before = self.scope.len();
        if let Some(k) = &node.key_var {
            self.scope.push(k.as_str().to_string());
        }
        self.scope.push(node.value_var.as_str().to_string());
        self.visit_template(&node.template);
        self.scope.truncate(before);
    }
}

/// References in one expression, with `scope` (iterators of enclosing `dynamic` blocks) left out.
fn refs_of(expr: &Expression, scope: &[String]) -> RefCollector {
    let mut c = RefCollector { scope: scope.to_vec(), ..Default::default() };
    c.visit_expr(expr);
    c
}

/// Every attribute value in `body` (a block named `parent`), recursively, with the `dynamic`
/// iterators in scope for it. Left out, because they name things rather than reference values:
/// `lifecycle.ignore_changes` (attribute names), a variable's `type` (a type constraint), and
/// `provider`/`providers` (provider configurations).
fn each_value<'a>(
    body: &'a Body,
    parent: &str,
    scope: &mut Vec<String>,
    f: &mut dyn FnMut(&'a Attribute, &[String]),
) {
    for s in body.iter() {
        match s {
            Structure::Attribute(a) => {
                let key = a.key.as_str();
                let names = matches!((parent, key), ("lifecycle", "ignore_changes") | ("variable", "type"))
                    || key == "provider"
                    || key == "providers";
                if !names {
                    f(a, scope);
                }
            }
            Structure::Block(b) => {
                if b.ident.as_str() == "dynamic" {
                    // `for_each` and `iterator` are outside the iterator's scope; `content` is inside.
                    let name = attr(&b.body, "iterator")
                        .and_then(|a| match &a.value {
                            Expression::Variable(v) => Some(v.as_str().to_string()),
                            _ => None,
                        })
                        .or_else(|| labels(b).first().map(|l| l.to_string()))
                        .unwrap_or_default();
                    for a in b.body.attributes() {
                        if a.key.as_str() != "iterator" {
                            f(a, scope);
                        }
                    }
                    scope.push(name);
                    for content in blocks(&b.body, "content") {
                        each_value(&content.body, "content", scope, f);
                    }
                    scope.pop();
                } else {
                    each_value(&b.body, b.ident.as_str(), scope, f);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Declarations

struct Variable {
    has_default: bool,
}

#[derive(Default)]
struct Decls {
    variables: BTreeMap<String, Variable>,
    locals: BTreeMap<String, Expression>,
    resources: BTreeSet<(String, String)>,
    data: BTreeSet<(String, String)>,
    /// Module name -> resolved source directory for local sources.
    modules: BTreeMap<String, Option<PathBuf>>,
    outputs: BTreeSet<String>,
    required_providers: BTreeSet<String>,
}

fn declarations(module: &Module) -> Decls {
    let mut d = Decls::default();
    for file in &module.files {
        for b in file.body.blocks() {
            let l = labels(b);
            match (b.ident.as_str(), l.as_slice()) {
                ("variable", [name]) => {
                    d.variables.insert(
                        name.to_string(),
                        Variable { has_default: attr(&b.body, "default").is_some() },
                    );
                }
                ("locals", []) => {
                    for a in b.body.attributes() {
                        d.locals.insert(a.key.as_str().to_string(), a.value.clone());
                    }
                }
                ("resource", [t, n]) => {
                    d.resources.insert((t.to_string(), n.to_string()));
                }
                ("data", [t, n]) => {
                    d.data.insert((t.to_string(), n.to_string()));
                }
                ("module", [name]) => {
                    let dir = attr(&b.body, "source")
                        .and_then(|a| string_literal(&a.value))
                        .filter(|s| s.starts_with("./") || s.starts_with("../"))
                        .map(|s| module.dir.join(s));
                    d.modules.insert(name.to_string(), dir);
                }
                ("output", [name]) => {
                    d.outputs.insert(name.to_string());
                }
                ("terraform", []) => {
                    for rp in blocks(&b.body, "required_providers") {
                        for a in rp.body.attributes() {
                            d.required_providers.insert(a.key.as_str().to_string());
                        }
                    }
                }
                _ => {}
            }
        }
    }
    d
}

// ---------------------------------------------------------------------------------------------
// Checks

/// Checks every module under `root` (a `terraform/` directory); returns the problems found.
fn check_tree(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let modules = load_modules(root, &mut problems);
    if modules.is_empty() {
        problems.push(format!("{}: no .tf files", root.display()));
    }
    let decls: BTreeMap<&PathBuf, Decls> = modules.iter().map(|(dir, m)| (dir, declarations(m))).collect();
    for (dir, module) in &modules {
        check_module(module, &decls[dir], &decls, &mut problems);
    }
    problems
}

fn check_module(module: &Module, d: &Decls, all: &BTreeMap<&PathBuf, Decls>, problems: &mut Vec<String>) {
    let called = |name: &str| -> Option<&Decls> {
        let dir = d.modules.get(name)?.as_ref()?.canonicalize().ok()?;
        all.get(&dir)
    };
    let mut has_terraform_block = false;
    let mut providers_used = BTreeSet::new();

    for file in &module.files {
        // Every value in the file: references resolve, file paths exist.
        let mut scope = Vec::new();
        each_value(&file.body, "", &mut scope, &mut |a, scope| {
            let c = refs_of(&a.value, scope);
            for r in &c.refs {
                if let Some(problem) = check_ref(r, d, &called) {
                    problems.push(format!("{}: {problem}", file.at(r.span.clone().or_else(|| a.span()))));
                }
            }
            for call in &c.calls {
                check_file_call(call, module, d, file, a, problems);
            }
        });

        for b in file.body.blocks() {
            let l = labels(b);
            let at = file.at(b.span());
            match (b.ident.as_str(), l.as_slice()) {
                ("variable", [name]) => check_variable(name, b, file, &at, problems),
                ("output", [name]) => {
                    if !has_description(&b.body) {
                        problems.push(format!("{at}: output \"{name}\" has no description"));
                    }
                    match attr(&b.body, "value") {
                        None => problems.push(format!("{at}: output \"{name}\" has no value")),
                        Some(v) => {
                            let c = refs_of(&v.value, &[]);
                            if !c.refs.iter().any(is_declaration_ref) {
                                problems.push(format!(
                                    "{}: output \"{name}\" references nothing declared in the module",
                                    file.at(v.span())
                                ));
                            }
                        }
                    }
                }
                ("module", [name]) => check_module_call(name, b, module, file, &at, all, problems),
                ("terraform", []) => {
                    has_terraform_block = true;
                    check_terraform_block(b, file, &at, problems);
                }
                ("resource" | "data", [t, _]) => {
                    providers_used.insert(t.split('_').next().unwrap_or(t).to_string());
                    if let Some(p) = attr(&b.body, "provider") {
                        problems.push(format!(
                            "{}: provider aliases are not used in these modules; pass providers from the root",
                            file.at(p.span())
                        ));
                    }
                }
                _ => {}
            }
        }
    }

    let shown =
        module.files.first().map(|f| f.shown.rsplit_once('/').map_or("", |s| s.0)).unwrap_or_default();
    if !has_terraform_block {
        problems.push(format!("{shown}: no terraform block with required_version and required_providers"));
    }
    for p in providers_used {
        if p != "terraform" && !d.required_providers.contains(&p) {
            problems
                .push(format!("{shown}: uses provider \"{p}\" without a required_providers entry for it"));
        }
    }
}

fn is_declaration_ref(r: &Ref) -> bool {
    matches!(r.root.as_str(), "var" | "local" | "module" | "data")
        || (r.root.contains('_') && !r.attrs.is_empty())
}

fn check_ref<'a>(r: &Ref, d: &Decls, called: &dyn Fn(&str) -> Option<&'a Decls>) -> Option<String> {
    let first = r.attrs.first().map(String::as_str);
    let text = std::iter::once(r.root.as_str())
        .chain(r.attrs.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(".");
    match (r.root.as_str(), first) {
        ("var", Some(name)) if !d.variables.contains_key(name) => {
            Some(format!("{text}: variable \"{name}\" is not declared in this module"))
        }
        ("local", Some(name)) if !d.locals.contains_key(name) => {
            Some(format!("{text}: local \"{name}\" is not declared in this module"))
        }
        ("module", Some(name)) => {
            if !d.modules.contains_key(name) {
                return Some(format!("{text}: module \"{name}\" is not declared in this module"));
            }
            let output = r.attrs.get(1)?;
            let target = called(name)?;
            (!target.outputs.contains(output))
                .then(|| format!("{text}: module \"{name}\" has no output \"{output}\""))
        }
        ("data", Some(t)) => {
            let n = r.attrs.get(1)?;
            (!d.data.contains(&(t.to_string(), n.clone())))
                .then(|| format!("{text}: data source {t}.{n} is not declared in this module"))
        }
        ("var" | "local", Some(_)) => None,
        ("var" | "local" | "module" | "data", None) => Some(format!("{text}: incomplete reference")),
        ("path" | "terraform" | "count" | "each" | "self", _) => None,
        (root, Some(n)) if root.contains('_') => (!d.resources.contains(&(root.to_string(), n.to_string())))
            .then(|| format!("{text}: resource {root}.{n} is not declared in this module")),
        (root, _) => Some(format!(
            "{text}: unknown name \"{root}\" (not var, local, module, data, a resource or an iterator)"
        )),
    }
}

fn has_description(body: &Body) -> bool {
    attr(body, "description").and_then(|a| string_literal(&a.value)).is_some_and(|s| !s.trim().is_empty())
}

fn check_variable(name: &str, b: &Block, file: &TfFile, at: &str, problems: &mut Vec<String>) {
    if attr(&b.body, "type").is_none() {
        problems.push(format!("{at}: variable \"{name}\" has no type"));
    }
    if !has_description(&b.body) {
        problems.push(format!("{at}: variable \"{name}\" has no description"));
    }
    for v in blocks(&b.body, "validation") {
        let vat = file.at(v.span());
        let (Some(cond), Some(_)) = (attr(&v.body, "condition"), attr(&v.body, "error_message")) else {
            problems.push(format!("{vat}: validation of \"{name}\" needs condition and error_message"));
            continue;
        };
        let refs = refs_of(&cond.value, &[]).refs;
        let own = |r: &Ref| r.root == "var" && r.attrs.first().is_some_and(|a| a == name);
        if !refs.iter().any(own) {
            problems.push(format!("{vat}: validation of \"{name}\" does not test var.{name}"));
        }
        for r in refs.iter().filter(|r| is_declaration_ref(r) && !own(r)) {
            problems.push(format!(
                "{}: validation of \"{name}\" refers to {}.{} (only var.{name} is allowed before Terraform 1.9)",
                file.at(r.span.clone()),
                r.root,
                r.attrs.join(".")
            ));
        }
    }
}

fn check_module_call(
    name: &str,
    b: &Block,
    module: &Module,
    file: &TfFile,
    at: &str,
    all: &BTreeMap<&PathBuf, Decls>,
    problems: &mut Vec<String>,
) {
    let Some(source) = attr(&b.body, "source").and_then(|a| string_literal(&a.value)) else {
        problems.push(format!("{at}: module \"{name}\" has no literal source"));
        return;
    };
    if !(source.starts_with("./") || source.starts_with("../")) {
        return; // a registry or git module: nothing to check here
    }
    let Ok(dir) = module.dir.join(source).canonicalize() else {
        problems.push(format!("{at}: module \"{name}\": source {source} does not exist"));
        return;
    };
    let Some(target) = all.get(&dir) else {
        problems.push(format!("{at}: module \"{name}\": source {source} has no .tf files"));
        return;
    };
    const META: &[&str] = &["source", "version", "count", "for_each", "providers", "depends_on"];
    let mut passed = BTreeSet::new();
    for a in b.body.attributes() {
        let key = a.key.as_str();
        if META.contains(&key) {
            continue;
        }
        passed.insert(key.to_string());
        if !target.variables.contains_key(key) {
            problems.push(format!(
                "{}: module \"{name}\" passes \"{key}\", which {source} does not declare as a variable",
                file.at(a.span())
            ));
        }
    }
    for (var, v) in &target.variables {
        if !v.has_default && !passed.contains(var) {
            problems
                .push(format!("{at}: module \"{name}\" does not pass \"{var}\", which {source} requires"));
        }
    }
}

fn check_terraform_block(b: &Block, file: &TfFile, at: &str, problems: &mut Vec<String>) {
    if attr(&b.body, "required_version").and_then(|a| string_literal(&a.value)).is_none() {
        problems.push(format!("{at}: terraform block has no required_version"));
    }
    let mut any = false;
    for rp in blocks(&b.body, "required_providers") {
        for a in rp.body.attributes() {
            any = true;
            let p = a.key.as_str();
            let pat = file.at(a.span());
            let Expression::Object(obj) = &a.value else {
                problems
                    .push(format!("{pat}: required_providers.{p} must be {{ source = ..., version = ... }}"));
                continue;
            };
            let field = |k: &str| {
                obj.iter().find_map(|(key, v)| {
                    let name = match key {
                        ObjectKey::Ident(i) => i.as_str().to_string(),
                        ObjectKey::Expression(e) => string_literal(e).unwrap_or_default().to_string(),
                    };
                    (name == k).then(|| string_literal(v.expr()).map(str::to_string)).flatten()
                })
            };
            if field("source").is_none() {
                problems.push(format!("{pat}: required_providers.{p} has no source"));
            }
            match field("version") {
                None => problems.push(format!("{pat}: required_providers.{p} does not pin a version")),
                Some(v) if !has_upper_bound(&v) => problems.push(format!(
                    "{pat}: required_providers.{p} version \"{v}\" has no upper bound (use ~> or < so a new major version cannot slip in)"
                )),
                Some(_) => {}
            }
        }
    }
    if !any {
        problems.push(format!("{at}: terraform block has no required_providers"));
    }
}

/// A constraint is bounded above by `~>`, `<`, `<=`, or an exact version (`1.2.3`, `= 1.2.3`).
fn has_upper_bound(constraint: &str) -> bool {
    constraint.split(',').map(str::trim).any(|c| {
        c.starts_with("~>")
            || c.starts_with('<')
            || c.starts_with('=')
            || c.chars().next().is_some_and(|ch| ch.is_ascii_digit())
    })
}

/// Resolves a path argument made of literals, `path.module` and locals that are themselves such
/// paths; None when it depends on anything else.
fn static_path(expr: &Expression, module: &Module, d: &Decls, depth: usize) -> Option<String> {
    if depth > 8 {
        return None;
    }
    match expr {
        Expression::String(s) => Some(s.as_str().to_string()),
        Expression::Traversal(t) => {
            let Expression::Variable(root) = &t.expr else { return None };
            let attrs: Vec<&str> = t
                .operators
                .iter()
                .filter_map(|op| match op.value() {
                    TraversalOperator::GetAttr(n) => Some(n.as_str()),
                    _ => None,
                })
                .collect();
            match (root.as_str(), attrs.as_slice()) {
                ("path", ["module"]) => Some(module.dir.display().to_string()),
                ("local", [name]) => static_path(d.locals.get(*name)?, module, d, depth + 1),
                _ => None,
            }
        }
        Expression::StringTemplate(t) => {
            let mut out = String::new();
            for e in t.iter() {
                match e {
                    Element::Literal(l) => out.push_str(l.value()),
                    Element::Interpolation(i) => out.push_str(&static_path(&i.expr, module, d, depth + 1)?),
                    Element::Directive(_) => return None,
                }
            }
            Some(out)
        }
        _ => None,
    }
}

fn check_file_call(
    call: &FuncCall,
    module: &Module,
    d: &Decls,
    file: &TfFile,
    a: &Attribute,
    problems: &mut Vec<String>,
) {
    let func = call.name.name.as_str();
    if !matches!(func, "file" | "filebase64" | "templatefile") {
        return;
    }
    let at = file.at(call.span().or_else(|| a.span()));
    let Some(path) = call.args.get(0).and_then(|p| static_path(p, module, d, 0)) else {
        problems
            .push(format!("{at}: {func}(): the path must be a literal built from path.module and locals"));
        return;
    };
    let text = std::fs::read_to_string(&path);
    // Shown relative to the checked tree, like the .tf files.
    let module_shown = file.shown.rsplit_once('/').map_or("", |s| s.0);
    let path = path.replacen(&module.dir.display().to_string(), module_shown, 1);
    let Ok(text) = text else {
        problems.push(format!("{at}: {func}(): {path} does not exist"));
        return;
    };
    if func != "templatefile" {
        return;
    }
    let template = match hcl::edit::parser::parse_template(&text) {
        Ok(t) => t,
        Err(e) => {
            problems.push(format!(
                "{at}: templatefile(): {path}:{} is not a valid template: {}",
                e.location().line(),
                e.message()
            ));
            return;
        }
    };
    let mut c = RefCollector::default();
    c.visit_template(&template);
    let used: BTreeSet<String> = c.refs.iter().map(|r| r.root.clone()).collect();
    let Some(Expression::Object(vars)) = call.args.get(1) else {
        problems.push(format!("{at}: templatefile(): the variables must be an object literal"));
        return;
    };
    let passed: BTreeSet<String> = vars
        .iter()
        .filter_map(|(k, _)| match k {
            ObjectKey::Ident(i) => Some(i.as_str().to_string()),
            ObjectKey::Expression(e) => string_literal(e).map(str::to_string),
        })
        .collect();
    for missing in used.difference(&passed) {
        problems.push(format!("{at}: templatefile(): {path} uses \"{missing}\", which is not passed"));
    }
    for extra in passed.difference(&used) {
        problems.push(format!("{at}: templatefile(): passes \"{extra}\", which {path} does not use"));
    }
}

// ---------------------------------------------------------------------------------------------
// The tests

#[test]
fn terraform_modules_and_examples_are_consistent() {
    let root = repo_root().join("terraform");
    let problems = check_tree(&root);
    assert!(problems.is_empty(), "{} problem(s) in terraform/:\n{}", problems.len(), problems.join("\n"));

    // The layout the docs promise.
    for dir in [
        "modules/bucket",
        "modules/iam",
        "modules/security",
        "modules/metadata",
        "modules/agents",
        "examples/aws",
        "examples/localstack",
    ] {
        assert!(root.join(dir).join("main.tf").is_file(), "terraform/{dir}/main.tf is missing");
    }
}

/// Writes `files` (path -> text) under a temporary directory and checks it.
fn check_files(files: &[(&str, &str)]) -> (tempfile::TempDir, String) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("terraform");
    for (path, text) in files {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }
    let problems = check_tree(&root).join("\n");
    (tmp, problems)
}

const VERSIONS: &str = r#"terraform {
  required_version = ">= 1.5.0"
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.80, < 7.0" }
  }
}
"#;

#[test]
fn terraform_checker_finds_each_kind_of_mistake_with_file_and_line() {
    let module = r#"variable "name" {
  description = "A name."
  type        = string
}

variable "untyped" {
  description = "No type."
}

variable "size" {
  description = "A size."
  type        = number
  validation {
    condition     = var.size > 0 && var.name != ""
    error_message = "Positive."
  }
}

resource "aws_s3_bucket" "this" {
  bucket = "${var.name}-${var.nmae}"
  tags   = { for k, v in local.tags : k => v if v != local.missing }
}

locals {
  tags = {}
}

output "arn" {
  description = "The ARN."
  value       = aws_s3_bucket.that.arn
}

output "constant" {
  description = "Nothing declared."
  value       = "x"
}
"#;
    let root = r#"module "m" {
  source   = "../modules/m"
  untyped  = 1
  size     = 2
  colour   = "red"
}

output "x" {
  description = "An output of the module."
  value       = module.m.nope
}
"#;
    let unpinned = r#"terraform {
  required_version = ">= 1.5.0"
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}
"#;
    let (_tmp, problems) = check_files(&[
        ("modules/m/versions.tf", VERSIONS),
        ("modules/m/main.tf", module),
        ("root/versions.tf", unpinned),
        ("root/main.tf", root),
    ]);
    for expected in [
        "terraform/modules/m/main.tf:6: variable \"untyped\" has no type",
        "terraform/modules/m/main.tf:14: validation of \"size\" refers to var.name",
        "terraform/modules/m/main.tf:20: var.nmae: variable \"nmae\" is not declared in this module",
        "terraform/modules/m/main.tf:21: local.missing: local \"missing\" is not declared in this module",
        "terraform/modules/m/main.tf:30: aws_s3_bucket.that.arn: resource aws_s3_bucket.that is not declared",
        "terraform/modules/m/main.tf:35: output \"constant\" references nothing declared",
        "terraform/root/main.tf:5: module \"m\" passes \"colour\", which ../modules/m does not declare",
        "terraform/root/main.tf:1: module \"m\" does not pass \"name\", which ../modules/m requires",
        "terraform/root/main.tf:10: module.m.nope: module \"m\" has no output \"nope\"",
        "terraform/root/versions.tf:4: required_providers.aws version \">= 5.0\" has no upper bound",
    ] {
        assert!(problems.contains(expected), "expected `{expected}` among:\n{problems}");
    }
    // The iterators k and v are not taken for undeclared names.
    assert!(!problems.contains("\"k\"") && !problems.contains("\"v\""), "{problems}");
    // An unparsable file is reported with its line.
    let (_tmp, problems) =
        check_files(&[("m/versions.tf", VERSIONS), ("m/main.tf", "locals {\n  a = \n}\n")]);
    assert!(problems.contains("terraform/m/main.tf:"), "{problems}");
    assert!(problems.contains("does not parse"), "{problems}");
}

#[test]
fn terraform_checker_checks_templatefile_variables_and_paths() {
    let module = r#"locals {
  dir = "${path.module}/files"
}

resource "aws_s3_object" "a" {
  bucket  = "b"
  key     = "k"
  content = templatefile("${local.dir}/t.env", { name = "x", extra = 1 })
}

resource "aws_s3_object" "b" {
  bucket  = "b"
  key     = "k2"
  content = file("${path.module}/files/missing.txt")
}
"#;
    let (_tmp, problems) = check_files(&[
        ("m/versions.tf", VERSIONS),
        ("m/main.tf", module),
        ("m/files/t.env", "A=${name}\nB=${other}\n"),
    ]);
    assert!(problems.contains("t.env uses \"other\", which is not passed"), "{problems}");
    assert!(problems.contains("passes \"extra\", which"), "{problems}");
    assert!(problems.contains("terraform/m/main.tf:14: file():"), "{problems}");
    assert!(problems.contains("missing.txt does not exist"), "{problems}");
}

// ---------------------------------------------------------------------------------------------
// The bucket module applies what `silt bucket init` applies.

/// The body of the only `resource "<kind>" ...` block in the bucket module.
fn bucket_resource<'a>(files: &'a [TfFile], kind: &str) -> &'a Body {
    let found: Vec<&Block> = files
        .iter()
        .flat_map(|f| f.body.blocks())
        .filter(|b| b.ident.as_str() == "resource" && labels(b).first() == Some(&kind))
        .collect();
    assert_eq!(found.len(), 1, "the bucket module must have exactly one {kind}");
    &found[0].body
}

fn nested<'a>(body: &'a Body, path: &[&str]) -> &'a Body {
    path.iter().fold(body, |b, name| {
        let found = blocks(b, name);
        assert_eq!(found.len(), 1, "expected one block {name} in {path:?}");
        &found[0].body
    })
}

fn literal_value(body: &Body, key: &str) -> serde_json::Value {
    let a = attr(body, key).unwrap_or_else(|| panic!("no attribute {key}"));
    match &a.value {
        Expression::Bool(b) => serde_json::Value::Bool(*b.value()),
        Expression::Number(n) => {
            serde_json::Value::from(n.value().as_i64().unwrap_or_else(|| panic!("{key} is not an integer")))
        }
        Expression::String(s) => serde_json::Value::String(s.as_str().to_string()),
        other => panic!("{key} must be a literal so it can be compared with bucket.rs, not {other:?}"),
    }
}

fn traversal_text(expr: &Expression) -> String {
    let c = refs_of(expr, &[]);
    c.refs.iter().map(|r| format!("{}.{}", r.root, r.attrs.join("."))).collect::<Vec<_>>().join(",")
}

#[test]
fn terraform_bucket_module_applies_what_silt_bucket_init_applies() {
    let out = Command::new(silt_tests::silt_bin()).args(["bucket", "settings"]).output().expect("run silt");
    assert!(out.status.success(), "silt bucket settings failed: {}", String::from_utf8_lossy(&out.stderr));
    let settings: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&out.stdout).expect("silt bucket settings prints a JSON object");

    let mut problems = Vec::new();
    let modules = load_modules(&repo_root().join("terraform/modules/bucket"), &mut problems);
    assert!(problems.is_empty(), "{problems:?}");
    let files = &modules.values().next().expect("the bucket module").files;

    let sse = bucket_resource(files, "aws_s3_bucket_server_side_encryption_configuration");
    let pab = bucket_resource(files, "aws_s3_bucket_public_access_block");
    let lifecycle = bucket_resource(files, "aws_s3_bucket_lifecycle_configuration");
    // Lifecycle rules by id: the static ones, and the one a `dynamic "rule"` adds with versioning.
    let mut rules: BTreeMap<String, (&Body, Option<String>)> = BTreeMap::new();
    for r in blocks(lifecycle, "rule") {
        rules.insert(literal_value(&r.body, "id").as_str().expect("rule id").to_string(), (&r.body, None));
    }
    for d in blocks(lifecycle, "dynamic").into_iter().filter(|d| labels(d) == ["rule"]) {
        let content = nested(&d.body, &["content"]);
        let condition = attr(&d.body, "for_each").map(|a| traversal_text(&a.value));
        rules.insert(
            literal_value(content, "id").as_str().expect("rule id").to_string(),
            (content, condition),
        );
    }
    let rule = |id: &str| -> (&Body, Option<String>) {
        let (body, condition) = rules.get(id).unwrap_or_else(|| {
            panic!("the bucket module has no lifecycle rule {id:?}; it has {:?}", rules.keys())
        });
        (*body, condition.clone())
    };

    // Every rule filters on the prefix, as `silt bucket init` does, and has the id bucket.rs uses.
    let bucket_rs = std::fs::read_to_string(repo_root().join("cli/src/bucket.rs")).expect("read bucket.rs");
    for (id, (body, _)) in &rules {
        assert_eq!(
            traversal_text(&attr(nested(body, &["filter"]), "prefix").expect("filter prefix").value),
            "var.prefix"
        );
        assert!(
            bucket_rs.contains(&format!(".id(\"{id}\")")),
            "cli/src/bucket.rs has no lifecycle rule {id:?}"
        );
    }

    for (key, expected) in &settings {
        let actual = match key.as_str() {
            "sse_algorithm" => {
                literal_value(nested(sse, &["rule", "apply_server_side_encryption_by_default"]), key)
            }
            "block_public_acls"
            | "ignore_public_acls"
            | "block_public_policy"
            | "restrict_public_buckets" => literal_value(pab, key),
            "abort_incomplete_multipart_upload_days" => {
                let (body, condition) = rule("silt-abort-incomplete-multipart-uploads");
                assert_eq!(condition, None, "the multipart rule applies always, as in bucket init");
                literal_value(nested(body, &["abort_incomplete_multipart_upload"]), "days_after_initiation")
            }
            "noncurrent_version_expiration_days" => {
                let (body, condition) = rule("silt-expire-noncurrent-versions");
                assert_eq!(
                    condition.as_deref(),
                    Some("var.versioning"),
                    "the noncurrent rule applies with versioning only, as in bucket init --versioning"
                );
                literal_value(nested(body, &["noncurrent_version_expiration"]), "noncurrent_days")
            }
            other => panic!(
                "`silt bucket settings` prints {other:?}, which this test does not compare with \
                 terraform/modules/bucket: add it to the module and here"
            ),
        };
        assert_eq!(
            &actual, expected,
            "{key}: terraform/modules/bucket says {actual}, silt bucket settings says {expected}"
        );
    }
    assert!(settings.len() >= 7, "silt bucket settings printed too little: {settings:?}");
}

// ---------------------------------------------------------------------------------------------
// The systemd units in deploy/ match the binary and their environment files.

/// ExecStart of a unit file, and the EnvironmentFile= paths it reads.
fn unit(path: &Path) -> (String, Vec<String>) {
    let text = std::fs::read_to_string(path).expect("read unit");
    let exec = text.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart").to_string();
    let envs = text
        .lines()
        .filter_map(|l| l.strip_prefix("EnvironmentFile="))
        .map(|s| s.trim_start_matches('-').to_string())
        .collect();
    (exec, envs)
}

/// Variable names a unit's command line expands (`${X}` and `$X`).
fn expanded_vars(exec: &str) -> BTreeSet<String> {
    let mut vars = BTreeSet::new();
    let mut rest = exec;
    while let Some(i) = rest.find('$') {
        rest = &rest[i + 1..];
        let name: String = rest
            .trim_start_matches('{')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        vars.insert(name);
    }
    vars
}

/// NAME=... lines of an environment file template.
fn env_names(path: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(path)
        .expect("read env file")
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim().to_string()))
        .collect()
}

#[test]
fn terraform_systemd_units_use_flags_silt_has_and_variables_their_env_files_set() {
    let deploy = repo_root().join("deploy");
    for (role, env_file) in [("metadata", "env/metadata.env"), ("agent", "env/agent.env")] {
        let (exec, env_paths) = unit(&deploy.join(format!("systemd/silt-{role}.service")));
        assert!(exec.starts_with(&format!("/usr/local/bin/silt {role} ")), "{role}: {exec}");
        assert!(
            env_paths.contains(&format!("/etc/silt/{role}.env")),
            "{role} unit reads /etc/silt/{role}.env"
        );

        // Every variable the command line uses is set by the env file (the agent's id comes from
        // the per-machine file install-silt.sh writes).
        let mut set = env_names(&deploy.join(env_file));
        if role == "agent" {
            assert!(env_paths.contains(&"/etc/silt/agent-id.env".to_string()));
            let install = std::fs::read_to_string(deploy.join("install-silt.sh")).expect("install script");
            assert!(install.contains("SILT_AGENT_ID="), "install-silt.sh writes SILT_AGENT_ID");
            set.insert("SILT_AGENT_ID".into());
        }
        for var in expanded_vars(&exec) {
            assert!(set.contains(&var), "silt-{role}.service uses ${var}, which {env_file} does not set");
        }

        // Every flag exists in `silt <role> --help`.
        let help = Command::new(silt_tests::silt_bin()).args([role, "--help"]).output().expect("run silt");
        assert!(
            help.status.success(),
            "silt {role} --help failed: {}",
            String::from_utf8_lossy(&help.stderr)
        );
        let help = String::from_utf8_lossy(&help.stdout);
        for flag in exec.split_whitespace().filter(|w| w.starts_with("--")) {
            assert!(
                help.contains(&format!("{flag} ")),
                "silt-{role}.service passes {flag}, which `silt {role} --help` does not list"
            );
        }
    }
}
