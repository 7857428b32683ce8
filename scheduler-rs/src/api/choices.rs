//! Submit a validated request (`prepare::build`) as its `n` choices, or a batch of them, and
//! open each choice's text stream: the common tail of every generation endpoint.

use super::output::{OutputOptions, TextStream};
use super::prepare::{build, SamplingInput};
use super::AppState;
use crate::errors::ApiError;
use crate::ids::TierId;
use crate::state::{Fork, Submit};

/// Validate, submit, and open the text streams of `n` choices of one prompt (stop strings
/// matched on their text, the server's request timeout): choice 0 is dispatched as usual,
/// the others go to its groups as its forks, which share its prefill there
/// (engine/forks.py). A seeded request seeds choice `i` with `seed + i`, so that the choices
/// differ (as OpenAI's do) and each repeats. Dropping the streams aborts every choice.
pub fn start(
    state: &AppState,
    tier: TierId,
    input_ids: Vec<u32>,
    prompt_field: &str,
    sampling: &SamplingInput,
    stops: Vec<String>,
    n: usize,
) -> Result<Vec<TextStream>, ApiError> {
    let first = build(state, tier, input_ids, prompt_field, sampling)?;
    submit_choices(state, first, stops, sampling.output, n)
}

/// Submit `n` choices of a request `build` validated (see `start`); a batch
/// validates every prompt before it submits any.
pub fn submit_choices(
    state: &AppState,
    first: Submit,
    stops: Vec<String>,
    output: OutputOptions,
    n: usize,
) -> Result<Vec<TextStream>, ApiError> {
    let prompt_tokens = first.input_ids.len();
    let mut streams = Vec::with_capacity(n);
    let mut fork = None;
    for i in 0..n {
        let mut submit = first.clone();
        submit.sampling.seed = first.sampling.seed.map(|s| s.wrapping_add(i as u64));
        submit.fork_of = fork;
        let handle = state.router.submit(submit).map_err(ApiError::from)?;
        fork.get_or_insert(Fork {
            parent: handle.id(),
            class: handle.class(),
        });
        streams.push(
            TextStream::new(handle, state.model.clone(), stops.clone(), prompt_tokens)
                .with_timeout(state.request_timeout())
                .with_options(output),
        );
    }
    let metrics = &state.router.metrics.vllm;
    metrics.on_request(n, first.stop.max_tokens);
    Ok(streams)
}

/// `submit_choices` for each request of a batch (validated, all of them, by `build` first):
/// prompt `i`'s choice `c` is stream `i * n + c`.
pub fn submit_batch(
    state: &AppState,
    built: Vec<Submit>,
    stops: &[String],
    output: OutputOptions,
    n: usize,
) -> Result<Vec<TextStream>, ApiError> {
    let mut all = Vec::with_capacity(built.len() * n);
    for submit in built {
        all.extend(submit_choices(state, submit, stops.to_vec(), output, n)?);
    }
    Ok(all)
}
