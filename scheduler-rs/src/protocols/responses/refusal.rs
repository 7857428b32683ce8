//! A refused Responses field: its name (as the Responses request calls it) and why.

pub(super) type Refusal = (String, String);

pub(super) fn refuse(field: &str, why: impl Into<String>) -> Refusal {
    (field.to_string(), why.into())
}
