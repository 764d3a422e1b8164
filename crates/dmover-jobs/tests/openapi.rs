//! The API answers what its OpenAPI document (docs/openapi.json) says: a real service
//! on loopback in front of two real servers, every documented operation called with
//! good and bad input, each answer's status looked up in the document and its body
//! validated against the schema there; every status the document lists is seen; the
//! routes the router declares are the document's paths, and nothing else is served.
//!
//! The schemas are checked by the small validator below, for the subset of JSON Schema
//! the document uses (`$ref`, `type`, `enum`, `const`, `properties`, `required`,
//! `additionalProperties`, `items`, `minItems`, `minimum`, `maximum`, `minLength`, and
//! annotations). It refuses any other keyword, so the document cannot use one that
//! would go unchecked. (The `jsonschema` crate would add some 25 crates to the build.)

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};

use common::{Lab, Running, bytes, start_api};
use serde_json::{Value, json};

const DOC: &str = include_str!("../../../docs/openapi.json");
const ROUTER_SOURCE: &str = include_str!("../src/api.rs");

/// The methods probed on every path.
const METHODS: [&str; 5] = ["get", "post", "put", "delete", "patch"];

fn doc() -> Value {
    serde_json::from_str(DOC).expect("docs/openapi.json is JSON")
}

/// What `$ref` names (`#/a/b`), else the value itself.
fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let p = r.strip_prefix('#').expect("local references only");
            resolve(
                doc,
                doc.pointer(p)
                    .unwrap_or_else(|| panic!("{r} is in the document")),
            )
        }
        None => v,
    }
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        _ => panic!("unknown type {t:?}"),
    }
}

/// The ways `v` breaks `schema` (none: valid), each with its JSON path `at`.
fn validate(doc: &Value, schema: &Value, v: &Value, at: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let s = schema.as_object().expect("a schema is an object");
    for (k, want) in s {
        match k.as_str() {
            "$ref" => errs.extend(validate(doc, resolve(doc, schema), v, at)),
            "type" => {
                let ok = match want {
                    Value::String(t) => type_matches(t, v),
                    Value::Array(ts) => ts.iter().any(|t| type_matches(t.as_str().unwrap(), v)),
                    _ => panic!("type {want}"),
                };
                if !ok {
                    errs.push(format!("{at}: {v} is not of type {want}"));
                }
            }
            "enum" if !want.as_array().unwrap().contains(v) => {
                errs.push(format!("{at}: {v} is not one of {want}"));
            }
            "const" if want != v => errs.push(format!("{at}: {v} is not {want}")),
            "minimum" | "maximum" => {
                if let Some(n) = v.as_f64() {
                    let bound = want.as_f64().unwrap();
                    if (k == "minimum" && n < bound) || (k == "maximum" && n > bound) {
                        errs.push(format!("{at}: {v} is beyond the {k} {want}"));
                    }
                }
            }
            "minLength" => {
                if let Some(t) = v.as_str() {
                    if (t.chars().count() as u64) < want.as_u64().unwrap() {
                        errs.push(format!("{at}: {v} is shorter than {want}"));
                    }
                }
            }
            "minItems" => {
                if let Some(a) = v.as_array() {
                    if (a.len() as u64) < want.as_u64().unwrap() {
                        errs.push(format!("{at}: fewer than {want} items"));
                    }
                }
            }
            "items" => {
                for (i, item) in v.as_array().into_iter().flatten().enumerate() {
                    errs.extend(validate(doc, want, item, &format!("{at}[{i}]")));
                }
            }
            "required" => {
                if let Some(o) = v.as_object() {
                    for name in want.as_array().unwrap() {
                        if !o.contains_key(name.as_str().unwrap()) {
                            errs.push(format!("{at}: {name} is missing"));
                        }
                    }
                }
            }
            "properties" => {
                if let Some(o) = v.as_object() {
                    for (name, sub) in want.as_object().unwrap() {
                        if let Some(x) = o.get(name) {
                            errs.extend(validate(doc, sub, x, &format!("{at}.{name}")));
                        }
                    }
                }
            }
            "additionalProperties" => {
                let known = s.get("properties").and_then(Value::as_object);
                for (name, x) in v.as_object().into_iter().flatten() {
                    if known.is_some_and(|p| p.contains_key(name)) {
                        continue;
                    }
                    match want {
                        Value::Bool(false) => errs.push(format!("{at}: {name} is not allowed")),
                        Value::Bool(true) => {}
                        sub => errs.extend(validate(doc, sub, x, &format!("{at}.{name}"))),
                    }
                }
            }
            "enum" | "const" | "description" | "title" | "default" | "format" | "examples"
            | "readOnly" => {}
            other => panic!("the validator does not know the keyword {other:?} (at {at})"),
        }
    }
    errs
}

/// An answer as it came over the wire.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "HTTP {}: not JSON ({e}): {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// One HTTP/1.1 request on its own connection, written by hand so that any method,
/// header and body can be sent and every byte of the answer seen.
fn http(addr: &str, method: &str, path: &str, auth: Option<&str>, body: Option<&[u8]>) -> Answer {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(a) = auth {
        req.push_str(&format!("Authorization: {a}\r\n"));
    }
    let body = body.unwrap_or_default();
    if !body.is_empty() || method != "GET" {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let (status, headers, body) = common::parse_answer(&raw);
    let a = Answer {
        status,
        headers,
        body,
    };
    if let Some(n) = a.header("content-length") {
        assert_eq!(n.parse::<usize>().unwrap(), a.body.len(), "{a:?}");
    }
    a
}

/// The error code the API pairs with each status.
fn code_of(status: u16) -> &'static str {
    match status {
        400 => "bad_request",
        401 => "unauthorized",
        404 => "not_found",
        409 => "conflict",
        413 | 429 => "limit",
        500 => "internal",
        s => panic!("no error code for {s}"),
    }
}

/// The service under test, the document, and what was checked so far.
struct Conformance {
    doc: Value,
    addr: String,
    /// (path template, method, status) of every answer checked.
    seen: BTreeSet<(String, String, u16)>,
}

impl Conformance {
    /// The document's operation `method` on `template`.
    fn operation(&self, template: &str, method: &str) -> &Value {
        let item = self.doc["paths"]
            .get(template)
            .unwrap_or_else(|| panic!("{template} is not in the document"));
        item.get(method)
            .unwrap_or_else(|| panic!("{method} {template} is not in the document"))
    }

    /// Checks a request body against the operation's request schema: `valid` says
    /// whether it must pass.
    fn check_request(&self, template: &str, method: &str, body: &Value, valid: bool) {
        let op = self.operation(template, method);
        let rb = resolve(&self.doc, &op["requestBody"]);
        let schema = &rb["content"]["application/json"]["schema"];
        let errs = validate(&self.doc, schema, body, "$");
        assert_eq!(errs.is_empty(), valid, "request {body}: {errs:?}");
    }

    /// Checks a query parameter's value against its schema: `valid` says whether it
    /// must pass.
    fn check_parameter(&self, template: &str, method: &str, name: &str, v: &Value, valid: bool) {
        let op = self.operation(template, method);
        let shared = &self.doc["paths"][template]["parameters"];
        let p = [&op["parameters"], shared]
            .into_iter()
            .filter_map(Value::as_array)
            .flatten()
            .map(|p| resolve(&self.doc, p))
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no parameter {name} of {method} {template}"));
        let errs = validate(&self.doc, &p["schema"], v, name);
        assert_eq!(errs.is_empty(), valid, "{name}={v}: {errs:?}");
    }

    /// Sends the request and checks the answer against the document: its status is one
    /// the operation lists, its headers are there, its body is JSON of the schema (an
    /// error's code the one of its status). Returns the body.
    fn call(
        &mut self,
        template: &str,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let auth = token.map(|t| format!("Bearer {t}"));
        let bytes = body.map(|b| serde_json::to_vec(b).unwrap());
        self.call_raw(template, method, path, auth.as_deref(), bytes.as_deref())
    }

    fn call_raw(
        &mut self,
        template: &str,
        method: &str,
        path: &str,
        auth: Option<&str>,
        body: Option<&[u8]>,
    ) -> (u16, Value) {
        let a = http(&self.addr, &method.to_uppercase(), path, auth, body);
        let op = self.operation(template, method).clone();
        let what = format!("{method} {path} → {}", a.status);
        let response = op["responses"]
            .get(a.status.to_string())
            .unwrap_or_else(|| panic!("{what}: the status is not documented: {a:?}"));
        let response = resolve(&self.doc, response);
        for (name, h) in response["headers"].as_object().into_iter().flatten() {
            let h = resolve(&self.doc, h);
            match a.header(name) {
                Some(v) => {
                    let errs = validate(&self.doc, &h["schema"], &json!(v), name);
                    assert!(errs.is_empty(), "{what}: {errs:?}");
                }
                None => assert!(h["required"] != true, "{what}: no {name} header"),
            }
        }
        let content = response["content"].as_object().expect("JSON content");
        let (ctype, media) = content.iter().next().unwrap();
        assert_eq!(a.header("content-type"), Some(ctype.as_str()), "{what}");
        // NDJSON: each line is checked, and the lines are returned as an array.
        let v = if ctype == "application/x-ndjson" {
            let text = String::from_utf8(a.body.clone()).unwrap();
            assert!(text.ends_with('\n'), "{what}: {text:?}");
            Value::Array(
                text.lines()
                    .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: {e}: {l}")))
                    .collect(),
            )
        } else {
            a.json()
        };
        let lines = match (&v, ctype.as_str()) {
            (Value::Array(lines), "application/x-ndjson") => lines.clone(),
            _ => vec![v.clone()],
        };
        for line in &lines {
            let errs = validate(&self.doc, &media["schema"], line, "$");
            assert!(
                errs.is_empty(),
                "{what}: the body breaks the schema: {errs:#?}\n{line:#}"
            );
        }
        if a.status >= 400 {
            assert_eq!(v["error"]["code"], code_of(a.status), "{what}: {v}");
        }
        self.seen
            .insert((template.to_string(), method.to_string(), a.status));
        (a.status, v)
    }

    /// Every (path, method, status) the document lists.
    fn documented(&self) -> BTreeSet<(String, String, u16)> {
        let mut all = BTreeSet::new();
        for (path, item) in self.doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                if method == "parameters" {
                    continue;
                }
                for status in op["responses"].as_object().unwrap().keys() {
                    all.insert((path.clone(), method.clone(), status.parse().unwrap()));
                }
            }
        }
        all
    }
}

/// The keywords [`validate`] checks or ignores.
const KEYWORDS: [&str; 18] = [
    "$ref",
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "minimum",
    "maximum",
    "minLength",
    "description",
    "title",
    "default",
    "format",
    "examples",
    "readOnly",
];

/// Checks every `schema` object below `v`: its keywords are [`KEYWORDS`], its
/// references resolve; counts them in `n`.
fn walk(doc: &Value, v: &Value, n: &mut usize) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                if k == "schema" || k == "schemas" {
                    let list: Vec<&Value> = if k == "schemas" {
                        x.as_object().unwrap().values().collect()
                    } else {
                        vec![x]
                    };
                    for s in list {
                        check_schema(doc, s, n);
                    }
                } else {
                    walk(doc, x, n);
                }
            }
            if let Some(r) = o.get("$ref") {
                resolve(doc, v);
                assert!(r.is_string());
            }
        }
        Value::Array(a) => a.iter().for_each(|x| walk(doc, x, n)),
        _ => {}
    }
}

fn check_schema(doc: &Value, s: &Value, n: &mut usize) {
    *n += 1;
    let o = s.as_object().expect("a schema is an object");
    for (k, x) in o {
        assert!(
            KEYWORDS.contains(&k.as_str()),
            "unknown keyword {k:?} in {s}"
        );
        match k.as_str() {
            "$ref" => drop(resolve(doc, s)),
            "properties" => x
                .as_object()
                .unwrap()
                .values()
                .for_each(|p| check_schema(doc, p, n)),
            "items" => check_schema(doc, x, n),
            "additionalProperties" if x.is_object() => check_schema(doc, x, n),
            _ => {}
        }
    }
}

/// The routes `router()` declares, read from its source: `(path, method)`, lower case.
fn declared_routes() -> BTreeSet<(String, String)> {
    let mut routes = BTreeSet::new();
    let src = &ROUTER_SOURCE[ROUTER_SOURCE.find("pub fn router(").unwrap()..];
    let src = &src[..src.find("\n}\n").unwrap()];
    for call in src.split(".route(\"").skip(1) {
        let (path, rest) = call.split_once('"').unwrap();
        let rest = &rest[..rest.find("\n").unwrap_or(rest.len())];
        for m in METHODS {
            if rest.contains(&format!(" {m}(")) || rest.contains(&format!(".{m}(")) {
                routes.insert((path.to_string(), m.to_string()));
            }
        }
    }
    assert!(!routes.is_empty(), "no .route( in router()");
    routes
}

#[test]
fn the_document_is_well_formed_and_lists_the_routers_routes() {
    let doc = doc();
    assert_eq!(doc["openapi"], "3.1.0");
    // Every schema in the document uses only what the validator checks, and every
    // reference resolves.
    let mut schemas = 0;
    walk(&doc, &doc, &mut schemas);
    assert!(schemas > 20, "{schemas} schemas");
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if method != "parameters" {
                assert!(METHODS.contains(&method.as_str()), "{method} {path}");
                documented.insert((path.clone(), method.clone()));
            }
        }
    }
    assert_eq!(
        documented,
        declared_routes(),
        "docs/openapi.json's operations and router()'s routes differ"
    );
}

#[test]
fn the_service_answers_what_the_document_says() {
    // A reads a chunk in 50 ms: a 6 MiB file takes seconds, long enough to cancel.
    let lab = Lab::new(Some(std::time::Duration::from_millis(50)));
    std::fs::write(lab.a_root.join("data/f"), bytes(7, 100_000)).unwrap();
    let mut cfg = lab.runner_config();
    // Nothing listens there: the webhook is tried and stays pending or fails.
    cfg.webhooks =
        dmover_jobs::webhook::Webhooks::new(&["http://127.0.0.1:9/hooks/".into()], None).unwrap();
    let svc = Running::start(&lab.db(), cfg);
    let url = start_api(&svc, None);
    let mut c = Conformance {
        doc: doc(),
        addr: url.strip_prefix("http://").unwrap().to_string(),
        seen: BTreeSet::new(),
    };
    let (jobs, one, cancel, retry, events) = (
        "/api/v1/jobs",
        "/api/v1/jobs/{id}",
        "/api/v1/jobs/{id}/cancel",
        "/api/v1/jobs/{id}/retry",
        "/api/v1/jobs/{id}/events",
    );
    let alice = Some("alice-token");
    let spec =
        |sources: &[&str], dest: &str| serde_json::to_value(lab.spec(sources, dest)).unwrap();

    // Submit: a job that is done, one with every option, one that fails by file.
    let good = spec(&["data/f"], "in/");
    c.check_request(jobs, "post", &good, true);
    let (s, j) = c.call(jobs, "post", jobs, alice, Some(&good));
    assert_eq!((s, &j["state"]), (201, &json!("queued")), "{j}");
    let done_id = j["id"].as_i64().unwrap();
    let mut full = spec(&["data/f"], "in/g");
    full["options"] = json!({
        "streams": 2, "continue_on_error": true, "verify": true, "route": "pull",
        "sync": null, "filters": [], "priority": 4, "notify": "http://127.0.0.1:9/hooks/full",
        "every_secs": null
    });
    c.check_request(jobs, "post", &full, true);
    let (s, j) = c.call(jobs, "post", jobs, alice, Some(&full));
    assert_eq!(s, 201, "{j}");
    assert_eq!(j["spec"]["options"], full["options"]);
    let full_id = j["id"].as_i64().unwrap();
    let missing = spec(&["data/nope"], "in/");
    let (s, j) = c.call(jobs, "post", jobs, alice, Some(&missing));
    assert_eq!(s, 201, "{j}");
    let failed_id = j["id"].as_i64().unwrap();
    for id in [done_id, full_id, failed_id] {
        svc.wait_end(id);
    }

    // Show, list and pages, the ended jobs' fields (times, file errors) included.
    let (s, j) = c.call(one, "get", &format!("{jobs}/{done_id}"), alice, None);
    assert_eq!(
        (s, &j["state"], &j["bytes"]),
        (200, &json!("done"), &json!(100_000))
    );
    let (s, j) = c.call(one, "get", &format!("{jobs}/{failed_id}"), alice, None);
    assert_eq!((s, &j["state"]), (200, &json!("failed")), "{j}");
    assert_eq!(j["file_errors"][0]["path"], "data/nope", "{j}");
    assert_eq!(
        c.call(one, "get", &format!("{jobs}/{full_id}"), alice, None)
            .0,
        200
    );
    for (q, valid) in [("1", true), ("1000", true), ("0", false), ("1001", false)] {
        c.check_parameter(
            jobs,
            "get",
            "limit",
            &json!(q.parse::<i64>().unwrap()),
            valid,
        );
        let (s, _) = c.call(jobs, "get", &format!("{jobs}?limit={q}"), alice, None);
        assert_eq!(s == 200, valid, "limit={q}");
    }
    let (_, page) = c.call(jobs, "get", &format!("{jobs}?limit=2"), alice, None);
    assert_eq!(page["next"], json!(full_id), "{page}");
    let (_, page) = c.call(
        jobs,
        "get",
        &format!("{jobs}?limit=2&before={full_id}"),
        alice,
        None,
    );
    assert_eq!(
        (page["jobs"][0]["id"].as_i64(), &page["next"]),
        (Some(done_id), &Value::Null)
    );
    assert_eq!(c.call(jobs, "get", jobs, Some("root-token"), None).0, 200);
    // An ended job's events: one line, the job.
    let (s, lines) = c.call(
        events,
        "get",
        &format!("{jobs}/{done_id}/events"),
        alice,
        None,
    );
    assert_eq!(s, 200);
    assert_eq!(lines.as_array().map(Vec::len), Some(1), "{lines}");
    assert_eq!(lines[0]["job"]["state"], "done", "{lines}");

    // A sync job, with filters and a priority.
    let mut mirror = spec(&["data"], "in/mirror");
    mirror["options"] = json!({
        "sync": {"delete": true},
        "filters": [{"include": false, "pattern": "*.tmp"}],
        "priority": 5
    });
    c.check_request(jobs, "post", &mirror, true);
    let (s, j) = c.call(jobs, "post", jobs, alice, Some(&mirror));
    assert_eq!(
        (s, &j["kind"], &j["priority"]),
        (201, &json!("sync"), &json!(5)),
        "{j}"
    );
    let mirror_id = j["id"].as_i64().unwrap();
    svc.wait_end(mirror_id);

    // Cancel and retry: a long job (A reads slowly) cancelled while it runs, retried,
    // cancelled again; a done job neither (409).
    std::fs::write(lab.a_root.join("data/big"), bytes(8, 6 << 20)).unwrap();
    let (s, j) = c.call(jobs, "post", jobs, alice, Some(&spec(&["data/big"], "in/")));
    assert_eq!(s, 201, "{j}");
    let big = j["id"].as_i64().unwrap();
    svc.wait(big, "data moving", |j| j.bytes > 0);
    let (s, j) = c.call(cancel, "post", &format!("{jobs}/{big}/cancel"), alice, None);
    assert_eq!(s, 200, "{j}");
    assert!(
        j["cancel_requested"] == true || j["state"] == "cancelled",
        "{j}"
    );
    assert_eq!(
        svc.wait_end(big).state,
        dmover_jobs::model::State::Cancelled
    );
    let (s, j) = c.call(retry, "post", &format!("{jobs}/{big}/retry"), alice, None);
    assert_eq!((s, &j["state"]), (200, &json!("queued")), "{j}");
    let (s, j) = c.call(cancel, "post", &format!("{jobs}/{big}/cancel"), alice, None);
    assert_eq!(s, 200, "{j}");
    svc.wait_end(big);
    let (s, _) = c.call(
        cancel,
        "post",
        &format!("{jobs}/{done_id}/cancel"),
        alice,
        None,
    );
    assert_eq!(s, 409);
    let (s, _) = c.call(
        retry,
        "post",
        &format!("{jobs}/{done_id}/retry"),
        alice,
        None,
    );
    assert_eq!(s, 409);

    // Bodies the document refuses, and the service refuses too (400).
    let b = format!("dmover://{}/in/", lab.b);
    let a = format!("dmover://{}/data/f", lab.a);
    for bad in [
        json!({"sources": "x", "destination": b}),
        json!({"sources": [], "destination": b}),
        json!({"sources": [a]}),
        json!({"sources": [a], "destination": b, "colour": "red"}),
        json!({"sources": [a], "destination": b, "options": {"streams": 0}}),
        json!({"sources": [a], "destination": b, "options": {"streams": 129}}),
        json!({"sources": [a], "destination": b, "options": {"route": "sideways"}}),
        json!({"sources": [a], "destination": b, "options": {"verify": "yes"}}),
        json!({"sources": [a], "destination": b, "options": {"compress": true}}),
        json!([a, b]),
    ] {
        c.check_request(jobs, "post", &bad, false);
        let (s, e) = c.call(jobs, "post", jobs, alice, Some(&bad));
        assert_eq!(s, 400, "{bad}: {e}");
    }
    // What the schema cannot say: a local path, sources on two servers, not JSON.
    let local = json!({"sources": ["/etc/hostname"], "destination": b});
    let mixed = json!({"sources": [a, format!("dmover://{}/x", lab.b)], "destination": b});
    for body in [local, mixed] {
        c.check_request(jobs, "post", &body, true);
        assert_eq!(
            c.call(jobs, "post", jobs, alice, Some(&body)).0,
            400,
            "{body}"
        );
    }
    let (s, _) = c.call_raw(jobs, "post", jobs, Some("Bearer alice-token"), Some(b"{"));
    assert_eq!(s, 400);
    // Bad ids and queries.
    for (t, m, p) in [
        (one, "get", "/api/v1/jobs/abc"),
        (one, "get", "/api/v1/jobs/0"),
        (cancel, "post", "/api/v1/jobs/-1/cancel"),
        (retry, "post", "/api/v1/jobs/x/retry"),
        (events, "get", "/api/v1/jobs/1.5/events"),
        (jobs, "get", "/api/v1/jobs?before=x"),
        (jobs, "get", "/api/v1/jobs?colour=red"),
    ] {
        assert_eq!(c.call(t, m, p, alice, None).0, 400, "{p}");
    }
    c.check_parameter(one, "get", "id", &json!(0), false);

    // No job, or another user's: 404 alike.
    for id in [9999, done_id] {
        for (t, m, p) in [
            (one, "get", format!("{jobs}/{id}")),
            (cancel, "post", format!("{jobs}/{id}/cancel")),
            (retry, "post", format!("{jobs}/{id}/retry")),
            (events, "get", format!("{jobs}/{id}/events")),
        ] {
            let token = if id == done_id {
                "bob-token"
            } else {
                "alice-token"
            };
            assert_eq!(c.call(t, m, &p, Some(token), None).0, 404, "{p}");
        }
    }

    // Without a valid bearer token, every operation is refused (401).
    let ops = [
        (jobs, "post", jobs.to_string()),
        (jobs, "get", jobs.to_string()),
        (one, "get", format!("{jobs}/{done_id}")),
        (cancel, "post", format!("{jobs}/{done_id}/cancel")),
        (retry, "post", format!("{jobs}/{done_id}/retry")),
        (events, "get", format!("{jobs}/{done_id}/events")),
    ];
    for (t, m, p) in &ops {
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("Bearer mon-token"),
            Some("Basic YWxpY2U6YWxpY2UtdG9rZW4="),
            Some("alice-token"),
        ] {
            let body = (*m == "post" && *t == jobs).then(|| serde_json::to_vec(&good).unwrap());
            let (s, e) = c.call_raw(t, m, p, auth, body.as_deref());
            assert_eq!(s, 401, "{m} {p} with {auth:?}: {e}");
        }
    }

    // Nothing else is served: a method a path does not have, and paths the document
    // does not list, get the API's 404 (or 405) and never a job.
    let doc_paths: Vec<String> = c.doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    for template in &doc_paths {
        let path = template.replace("{id}", &done_id.to_string());
        for m in METHODS {
            let documented = c.doc["paths"][template].get(m).is_some();
            let a = http(
                &c.addr,
                &m.to_uppercase(),
                &path,
                Some("Bearer alice-token"),
                None,
            );
            if documented {
                let fallback = a.status == 405
                    || (a.status == 404 && a.json()["error"]["message"] == "no such API path");
                assert!(!fallback, "{m} {path} is documented but not served: {a:?}");
            } else {
                assert!(
                    [404, 405].contains(&a.status),
                    "{m} {path} is served but not documented: {a:?}"
                );
            }
        }
    }
    for p in [
        "/",
        "/api",
        "/api/v1",
        "/api/v1/job",
        "/api/v2/jobs",
        "/api/v1/jobs/1/delete",
        "/api/v1/jobs/1/cancel/now",
        "/openapi.json",
    ] {
        for m in ["GET", "POST"] {
            let a = http(&c.addr, m, p, Some("Bearer alice-token"), None);
            assert_eq!(a.status, 404, "{m} {p} is served but not documented: {a:?}");
            assert_eq!(a.json()["error"]["message"], "no such API path", "{m} {p}");
        }
    }

    // The store failing: 500 from every operation.
    let db = rusqlite::Connection::open(lab.db()).unwrap();
    db.execute_batch("ALTER TABLE jobs RENAME TO jobs_gone")
        .unwrap();
    for (t, m, p) in &ops {
        let body = (*m == "post" && *t == jobs).then_some(&good);
        let (s, e) = c.call(t, m, p, alice, body);
        assert_eq!(s, 500, "{m} {p}: {e}");
    }
    db.execute_batch("ALTER TABLE jobs_gone RENAME TO jobs")
        .unwrap();

    // The caps (413, 429): a service of its own with max_sources 2 and one unfinished
    // job per user, and no runner (its jobs stay queued).
    let capped: std::sync::Arc<dyn dmover_jobs::store::JobStore> = std::sync::Arc::new(
        dmover_jobs::store::SqliteStore::open(&lab.dir.path().join("capped/jobs.sqlite"))
            .unwrap()
            .with_policy(dmover_jobs::store::Policy {
                link_concurrency: 4,
                max_unfinished_per_user: Some(1),
            }),
    );
    let mut cfg = lab.runner_config();
    cfg.max_sources = 2;
    let capped = Running {
        service: dmover_jobs::runner::Service::new(capped, cfg),
        rt: tokio::runtime::Runtime::new().unwrap(),
        stop: tokio_util::sync::CancellationToken::new(),
    };
    let main_addr = std::mem::replace(
        &mut c.addr,
        start_api(&capped, None)
            .strip_prefix("http://")
            .unwrap()
            .to_string(),
    );
    let three = spec(&["data/a", "data/b", "data/c"], "in/");
    assert_eq!(c.call(jobs, "post", jobs, alice, Some(&three)).0, 413);
    assert_eq!(c.call(jobs, "post", jobs, alice, Some(&good)).0, 201);
    assert_eq!(c.call(jobs, "post", jobs, alice, Some(&good)).0, 429);
    c.addr = main_addr;

    // Every status the document lists was seen.
    let missed: Vec<_> = c.documented().difference(&c.seen).cloned().collect();
    assert!(
        missed.is_empty(),
        "documented but never answered: {missed:?}"
    );
    svc.stop();
}
