//! Run one simulation from a config JSON file (docs/planner.md) and print the result JSON
//! without per-request records: `cargo run --release --example simulate -- CONFIG.json`.

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: simulate CONFIG.json"))?;
    let mut cfg: nitsum_scheduler::sim::SimConfig =
        serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    cfg.records = std::env::var_os("SIM_RECORDS").is_some();
    let out = nitsum_scheduler::sim::simulate(&cfg)?;
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
