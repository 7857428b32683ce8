use super::*;

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// NOTE: reads api/mod.rs itself: a route added there and not to `ROUTES` fails here.
#[test]
fn every_route_of_the_router_is_described() {
    let doc = spec(&names(&["m"]), &names(&["strict"]));
    let source = include_str!("mod.rs");
    let mut seen = 0;
    for piece in source.split(".route(").skip(1) {
        let path = piece.split('"').nth(1).unwrap();
        let handlers = piece.split(')').next().unwrap_or_default();
        for method in ["get", "post"] {
            if piece[..piece.find("\n        .").unwrap_or(piece.len())]
                .contains(&format!("{method}("))
            {
                assert!(
                    doc["paths"][path][method].is_object(),
                    "{method} {path} is not in /openapi.json ({handlers})"
                );
                seen += 1;
            }
        }
    }
    assert_eq!(
        seen,
        ROUTES.len(),
        "ROUTES describes a route api/mod.rs lacks"
    );
}

#[test]
fn model_and_tier_are_the_deployments_values() {
    let doc = spec(&names(&["a", "b"]), &names(&["strict", "batch"]));
    let text = doc["components"]["schemas"].to_string();
    assert!(text.contains(r#""enum":["a","b"]"#), "{text}");
    assert!(text.contains(r#""enum":["strict","batch"]"#), "{text}");
    let chat = &doc["paths"]["/v1/chat/completions"]["post"];
    assert_eq!(
        chat["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/ChatCompletionRequest"
    );
    assert!(chat["responses"]["200"]["content"]["text/event-stream"].is_object());
    for (name, _) in doc["components"]["schemas"].as_object().unwrap() {
        assert!(!name.is_empty());
    }
}

/// The router refuses unknown fields: the request schemas say so, with every field the
/// flattened parts take (CommonParams, VllmFields) in the one object.
#[test]
fn request_bodies_are_closed_and_name_every_field() {
    let doc = spec(&names(&["m"]), &names(&["strict"]));
    let chat = &doc["components"]["schemas"]["ChatCompletionRequest"];
    assert_eq!(chat["additionalProperties"], false);
    for field in [
        "messages",
        "max_tokens",
        "tier",
        "guided_json",
        "chat_template",
    ] {
        assert!(chat["properties"][field].is_object(), "{field}");
    }
    let role = &doc["components"]["schemas"]["ChatMessage"]["properties"]["role"];
    assert_eq!(role["enum"][2], "user");
    let sampling = &doc["components"]["schemas"]["NativeSampling"];
    assert_eq!(sampling["additionalProperties"], false);
}
