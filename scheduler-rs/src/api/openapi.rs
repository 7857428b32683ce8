//! `GET /openapi.json`: the HTTP API described from the router's own request types
//! (protocols/) and documented replies (protocols/http_replies.rs) by utoipa; `GET /docs`:
//! Swagger UI loaded from a CDN (as vLLM's `/docs`: nothing to bundle at build time).
//!
//! The components (schemas) are derived; the paths come from [`ROUTES`], one line per route.
//! The served model's names and the tiers go in as enums of the request fields `model` and
//! `tier`, so a client (or the fuzzer, tests/test_openapi_fuzz.py) knows what is accepted.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{Html, IntoResponse, Response};
use serde_json::{json, Map, Value};
use utoipa::OpenApi;

use super::tokenize_routes::{DetokenizeRequest, TokenizeRequest};
use super::AppState;
use crate::protocols::http_replies as replies;
use crate::protocols::native::NativeGenerateRequest;
use crate::protocols::openai::{ChatCompletionRequest, CompletionRequest};

/// The schemas: every request type and documented reply (and what they contain).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Nitsum",
        description = "OpenAI-compatible router with vLLM's and SGLang's endpoints \
                       (docs/router.md)"
    ),
    components(schemas(
        ChatCompletionRequest,
        CompletionRequest,
        NativeGenerateRequest,
        replies::ResponsesRequest,
        TokenizeRequest,
        DetokenizeRequest,
        replies::ErrorReply,
        replies::ChatCompletion,
        replies::Completion,
        replies::ResponseObject,
        replies::GenerateReply,
        replies::ModelList,
        replies::ModelCard,
        replies::Tokenized,
        replies::Detokenized,
        replies::Version,
        replies::Health,
        replies::Load,
        replies::ModelInfo,
        replies::ServerInfo,
        replies::Flushed,
        replies::TokenizerInfo,
        replies::AdminPlan,
    ))
)]
struct Schemas;

/// What a route answers with on success.
#[derive(Debug, Clone, Copy)]
enum Reply {
    /// A JSON body of this schema.
    Json(&'static str),
    /// This schema, or with `stream: true` server-sent events.
    JsonOrStream(&'static str),
    /// Prometheus text.
    Text,
    /// The viewer's HTML page.
    Html,
    /// The spec itself.
    Spec,
    /// No body.
    Empty,
}

/// One route: method, path, request body schema, reply.
type Route = (&'static str, &'static str, Option<&'static str>, Reply);

/// NOTE: every route of `api::router` (api/mod.rs), one line each; a unit test fails when
/// one is missing.
const ROUTES: &[Route] = &[
    (
        "post",
        "/v1/chat/completions",
        Some("ChatCompletionRequest"),
        Reply::JsonOrStream("ChatCompletion"),
    ),
    (
        "post",
        "/v1/completions",
        Some("CompletionRequest"),
        Reply::JsonOrStream("Completion"),
    ),
    (
        "post",
        "/v1/responses",
        Some("ResponsesRequest"),
        Reply::JsonOrStream("ResponseObject"),
    ),
    ("get", "/v1/models", None, Reply::Json("ModelList")),
    ("get", "/v1/models/{id}", None, Reply::Json("ModelCard")),
    (
        "post",
        "/tokenize",
        Some("TokenizeRequest"),
        Reply::Json("Tokenized"),
    ),
    (
        "post",
        "/detokenize",
        Some("DetokenizeRequest"),
        Reply::Json("Detokenized"),
    ),
    ("get", "/tokenizer_info", None, Reply::Json("TokenizerInfo")),
    ("get", "/version", None, Reply::Json("Version")),
    (
        "post",
        "/generate",
        Some("NativeGenerateRequest"),
        Reply::JsonOrStream("GenerateReply"),
    ),
    ("get", "/health", None, Reply::Json("Health")),
    ("get", "/metrics", None, Reply::Text),
    ("get", "/admin/plan", None, Reply::Json("AdminPlan")),
    ("get", "/ping", None, Reply::Json("Health")),
    ("post", "/ping", None, Reply::Json("Health")),
    ("get", "/load", None, Reply::Json("Load")),
    ("post", "/flush_cache", None, Reply::Json("Flushed")),
    ("post", "/reset_prefix_cache", None, Reply::Json("Flushed")),
    ("get", "/get_model_info", None, Reply::Json("ModelInfo")),
    ("get", "/server_info", None, Reply::Json("ServerInfo")),
    ("get", "/get_server_info", None, Reply::Json("ServerInfo")),
    ("get", "/health_generate", None, Reply::Empty),
    ("post", "/health_generate", None, Reply::Empty),
    ("get", "/openapi.json", None, Reply::Spec),
    ("get", "/docs", None, Reply::Html),
];

fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn json_content(name: &str) -> Value {
    json!({"application/json": {"schema": schema_ref(name)}})
}

/// The responses of one operation: its success, and every error in OpenAI's shape.
fn responses(reply: Reply) -> Value {
    let ok = match reply {
        Reply::Json(name) => json!({"description": "OK", "content": json_content(name)}),
        Reply::JsonOrStream(name) => {
            let mut content = json_content(name);
            content["text/event-stream"] = json!({"schema": {"type": "string"}});
            json!({"description": "OK (with `stream`: server-sent events)", "content": content})
        }
        Reply::Text => json!({"description": "Prometheus text",
                              "content": {"text/plain": {"schema": {"type": "string"}}}}),
        Reply::Html => json!({"description": "Swagger UI",
                              "content": {"text/html": {"schema": {"type": "string"}}}}),
        Reply::Spec => json!({"description": "this document",
                              "content": {"application/json": {"schema": {"type": "object"}}}}),
        Reply::Empty => json!({"description": "OK"}),
    };
    let error = |why: &str| json!({"description": why, "content": json_content("ErrorReply")});
    let mut out = json!({
        "200": ok,
        "4XX": error("the request is refused (the message and `param` say why)"),
        "503": error("no worker can serve it now, or the router is draining"),
    });
    if matches!(reply, Reply::Json("Health")) {
        // NOTE: /health answers 503 in its own shape (`no_workers`), not as an error.
        out["503"] =
            json!({"description": "no worker registered", "content": json_content("Health")});
    }
    out
}

fn operation(method: &str, path: &str, body: Option<&str>, reply: Reply) -> Value {
    let id = format!("{method}{}", path.replace(['/', '{', '}', '.'], "_"));
    let mut op = json!({"operationId": id, "responses": responses(reply)});
    if let Some(name) = body {
        op["requestBody"] = json!({"required": true, "content": json_content(name)});
    }
    if path.contains("{id}") {
        op["parameters"] = json!([{"name": "id", "in": "path", "required": true,
                                   "schema": {"type": "string"}}]);
    }
    op
}

/// Give every request schema's `model` and `tier` properties the values this deployment
/// accepts.
fn name_the_values(schemas: &mut Map<String, Value>, models: &[String], tiers: &[String]) {
    for schema in schemas.values_mut() {
        set_enum(schema, "model", models);
        set_enum(schema, "tier", tiers);
    }
}

/// `schema`'s property `name` (also inside `allOf` parts) gets `values` as its enum.
fn set_enum(schema: &mut Value, name: &str, values: &[String]) {
    if let Some(all) = schema.get_mut("allOf").and_then(Value::as_array_mut) {
        for part in all {
            set_enum(part, name, values);
        }
    }
    if let Some(prop) = schema.pointer_mut(&format!("/properties/{name}")) {
        let kind = json!({"type": "string", "enum": values});
        // NOTE: optional fields stay nullable, as the derived schema had them.
        let nullable = prop.to_string().contains("null");
        *prop = if nullable {
            json!({"oneOf": [kind, {"type": "null"}]})
        } else {
            kind
        };
    }
}

/// Request bodies whose unknown fields the router refuses (protocols/extensions.rs): closed
/// in the spec (`additionalProperties: false`), their flattened parts inlined.
const CLOSED: [&str; 5] = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "NativeGenerateRequest",
    "NativeSampling",
    "StreamOptions",
];

/// The properties of `schema` and of its `allOf` parts (references followed) into `out`.
fn all_properties(schemas: &Map<String, Value>, schema: &Value, out: &mut Map<String, Value>) {
    let target = schema.get("$ref").and_then(Value::as_str);
    if let Some(name) = target.and_then(|r| r.strip_prefix("#/components/schemas/")) {
        if let Some(s) = schemas.get(name) {
            all_properties(schemas, s, out);
        }
        return;
    }
    if let Some(Value::Array(parts)) = schema.get("allOf") {
        for part in parts {
            all_properties(schemas, part, out);
        }
    }
    if let Some(Value::Object(props)) = schema.get("properties") {
        out.extend(props.clone());
    }
}

/// NOTE: a flattened `extra` map (what no named field took, checked by
/// `extensions::refused`) derives as "any other property"; the router refuses those (vLLM's
/// neutral extensions aside), so the spec names exactly the fields it takes. Chat roles are
/// the ones the templates know.
fn close_requests(schemas: &mut Map<String, Value>) {
    for name in CLOSED {
        let Some(schema) = schemas.get(name) else {
            continue;
        };
        let mut props = Map::new();
        all_properties(schemas, schema, &mut props);
        let closed = json!({"type": "object", "description": schema["description"],
                            "properties": props, "additionalProperties": false});
        schemas.insert(name.to_string(), closed);
    }
    if let Some(role) = schemas
        .get_mut("ChatMessage")
        .and_then(|m| m.pointer_mut("/properties/role"))
    {
        *role = json!({"type": "string", "enum": crate::protocols::openai::CHAT_ROLES});
    }
}

/// The whole document for this deployment.
pub fn spec(models: &[String], tiers: &[String]) -> Value {
    let mut doc = serde_json::to_value(Schemas::openapi()).unwrap_or_else(|_| json!({}));
    let mut paths = Map::new();
    for &(method, path, body, reply) in ROUTES {
        let item = paths.entry(path).or_insert_with(|| json!({}));
        item[method] = operation(method, path, body, reply);
    }
    doc["paths"] = Value::Object(paths);
    doc["info"]["version"] = json!(env!("CARGO_PKG_VERSION"));
    if let Some(Value::Object(schemas)) = doc.pointer_mut("/components/schemas") {
        close_requests(schemas);
        name_the_values(schemas, models, tiers);
    }
    doc
}

/// `GET /openapi.json`.
pub async fn openapi_json(State(state): State<Arc<AppState>>) -> Response {
    let models: Vec<String> = state.model_names().map(String::from).collect();
    let tiers: Vec<String> = state
        .router
        .cfg
        .tiers
        .iter()
        .map(|t| t.name.clone())
        .collect();
    axum::Json(spec(&models, &tiers)).into_response()
}

/// `GET /docs`: Swagger UI (from the jsDelivr CDN) on `/openapi.json`.
pub async fn docs() -> Html<&'static str> {
    Html(DOCS_PAGE)
}

/// NOTE: `url` is relative, so the page works under `--root-path` too.
const DOCS_PAGE: &str = r##"<!doctype html>
<html>
<head>
<meta charset="utf-8">
<title>Nitsum API</title>
<link rel="stylesheet" href="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({url: "openapi.json", dom_id: "#swagger-ui"});
</script>
</body>
</html>
"##;

#[cfg(test)]
#[path = "openapi_tests.rs"]
mod tests;
