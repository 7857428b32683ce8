//! `nitsum-router`: the OpenAI-compatible Nitsum router (see docs/router.md).

fn main() {
    std::process::exit(nitsum_scheduler::server::cli_main(std::env::args_os()));
}
