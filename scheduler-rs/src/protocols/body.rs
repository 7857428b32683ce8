//! A request's JSON body parsed into its type, with failures in the OpenAI error shape (a
//! type error names its field as `param`).

/// Parse a JSON body into `T`, mapping failures to the OpenAI error shape.
pub fn parse_body<T: serde::de::DeserializeOwned>(
    body: &[u8],
) -> Result<T, crate::errors::ApiError> {
    // NOTE: a type error names its field (`param`), as a hand-written check would: from the
    // deserializer's path, or, for fields inside `#[serde(flatten)]` (whose errors lose the
    // path and point at the object's end), by finding the one top-level field that fails alone.
    // NOTE: `end` refuses bytes after the value (a second object, garbage): serde_json's
    // `from_slice` checks that, a bare `Deserializer` does not, and a request that is not one
    // JSON value must not half-run.
    let de = &mut serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let param = if !inner.is_data() {
            None // a syntax error: no field to name
        } else if !matches!(path.as_str(), "" | "." | "?") {
            Some(path)
        } else {
            failing_field::<T>(body)
        };
        let mut err =
            crate::errors::ApiError::bad_json(format!("could not parse the JSON body: {inner}"));
        err.param = param;
        err
    })?;
    de.end().map_err(|e| {
        crate::errors::ApiError::bad_json(format!(
            "could not parse the JSON body: bytes after the JSON value ({e})"
        ))
    })?;
    Ok(value)
}

/// The top-level field of a JSON object body that `T` cannot take even on its own (every
/// request type here has only optional fields, so one field alone parses unless it is bad).
fn failing_field<T: serde::de::DeserializeOwned>(body: &[u8]) -> Option<String> {
    let serde_json::Value::Object(fields) = serde_json::from_slice(body).ok()? else {
        return None;
    };
    fields.into_iter().find_map(|(name, value)| {
        let alone = serde_json::Value::Object([(name.clone(), value)].into_iter().collect());
        serde_json::from_value::<T>(alone).is_err().then_some(name)
    })
}
