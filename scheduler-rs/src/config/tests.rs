//! The configuration: file over defaults, flags over the file, what is refused.

use std::path::Path;

use clap::Parser;

use super::*;
use crate::ids::TierId;
use crate::plan::Role;

#[test]
fn file_config_merges_over_defaults_and_validates() {
    let file: FileConfig = serde_json::from_str(
        r#"{"tiers": [{"name": "gold", "ttft_ms": 100, "tpot_ms": 10},
                      {"name": "bg", "ttft_ms": 0, "tpot_ms": 0, "background": true}],
            "api_keys": [{"key": "k1", "tiers": ["gold"], "default_tier": "gold"}],
            "plan": [{"members": [0, 1], "role": "prefill"}],
            "model_dir": "/models/tiny-llama"}"#,
    )
    .unwrap();
    let cfg = RouterConfig::from_file(file).unwrap();
    assert_eq!(cfg.served_model_name, "tiny-llama");
    assert_eq!(cfg.tier_index("bg"), Some(TierId(1)));
    let plan = cfg.static_plan.unwrap();
    assert_eq!((plan[0].tp, plan[0].role), (2, Role::Prefill));
    assert_eq!(plan[0].tiers, [TierId(0)]);
    assert_eq!(cfg.heartbeat_timeout_ms, 10_000);
}

#[test]
fn tensor_parallel_size_sets_the_default_level_and_the_planners_floor() {
    let cli = Cli::parse_from(["nitsum-router", "--tensor-parallel-size", "2"]);
    let cfg = RouterConfig::from_cli(&cli).unwrap();
    assert_eq!(cfg.default_tp, 2);
    let allowed = cfg.planner.for_pool(&[1, 2, 4], false).tp_levels.unwrap();
    assert_eq!(allowed, [2, 4]);
    let cli = Cli::parse_from(["nitsum-router", "--tensor-parallel-size", "0"]);
    assert!(RouterConfig::from_cli(&cli).is_err());
    assert_eq!(RouterConfig::default().default_tp, 1);
}

#[test]
fn env_api_keys_are_one_a_line_and_may_use_every_tier() {
    let keys = env_api_keys("k1\n\n  k2 \n").unwrap();
    assert_eq!(
        keys.iter().map(|k| k.key.as_str()).collect::<Vec<_>>(),
        ["k1", "k2"]
    );
    assert!(keys.iter().all(|k| k.tiers.is_empty() && !k.admin));
    assert!(env_api_keys("").unwrap().is_empty());
}

#[test]
fn bad_configs_are_refused() {
    for bad in [
        r#"{"tiers": []}"#,
        r#"{"tiers": [{"name": "b", "ttft_ms": 1, "tpot_ms": 1, "background": true}]}"#,
        r#"{"api_keys": [{"key": "k", "tiers": ["nope"]}]}"#,
        r#"{"api_keys": [{"key": "k", "tiers": ["strict"], "default_tier": "relaxed"}]}"#,
        r#"{"plan": [{"members": [0], "tiers": ["gold"]}]}"#,
        r#"{"api_keys": [{"key": "k", "max_inflight": 0}]}"#,
        r#"{"api_keys": [{"key": "k", "requests_per_minute": 0}]}"#,
        r#"{"api_keys": [{"key": "k", "requests_per_minute": -1.5}]}"#,
        r#"{"api_keys": [{"key": "k", "requests_per_minute": 60, "burst": 0}]}"#,
    ] {
        let file: FileConfig = serde_json::from_str(bad).unwrap();
        assert!(RouterConfig::from_file(file).is_err(), "{bad}");
    }
    assert!(serde_json::from_str::<FileConfig>(r#"{"listn": "x"}"#).is_err());
}

#[test]
fn control_loop_settings() {
    let d = RouterConfig::default();
    assert_eq!(
        (d.profile.is_none(), d.reconfigure_timeout_ms),
        (true, 5000)
    );
    let file: FileConfig = serde_json::from_str(
        r#"{"profile": "p.json", "planner": {"tp_levels": [1, 2]},
            "reconfigure_timeout_ms": 700}"#,
    )
    .unwrap();
    let cfg = RouterConfig::from_file(file).unwrap();
    assert_eq!(cfg.profile.as_deref(), Some(Path::new("p.json")));
    assert_eq!(cfg.planner.tp_levels, Some(vec![1, 2]));
    assert_eq!(cfg.planner.keep_utilization, 0.9);
    assert_eq!(cfg.reconfigure_timeout_ms, 700);
    let cli = Cli::try_parse_from(["r", "--profile", "q.json"]).unwrap();
    let cfg = RouterConfig::from_cli(&cli).unwrap();
    assert_eq!(cfg.profile.as_deref(), Some(Path::new("q.json")));
    let file: FileConfig = serde_json::from_str(r#"{"reconfigure_timeout_ms": 0}"#).unwrap();
    assert!(RouterConfig::from_file(file).is_err());
}

#[test]
fn several_routers_need_a_lease_and_a_ttl_only_an_etcd_one() {
    let parse = |args: &[&str]| {
        let argv = std::iter::once("nitsum-router").chain(args.iter().copied());
        RouterConfig::from_cli(&Cli::parse_from(argv))
    };
    let cfg = parse(&["--lease", "file:/tmp/l", "--router-index", "2"]).unwrap();
    assert_eq!(
        cfg.lease,
        Some(crate::lease::LeaseSpec::File("/tmp/l".into()))
    );
    assert_eq!((cfg.router_index, cfg.lease_ttl_ms), (2, None));
    let cfg = parse(&["--lease", "etcd:http://h:2379", "--lease-ttl-ms", "3000"]).unwrap();
    assert_eq!(cfg.lease_ttl_ms, Some(3000));
    for bad in [
        &["--router-index", "1"][..],
        &["--peer-addr", "tcp://10.0.0.1:5557"],
        &["--lease", "file:/tmp/l", "--lease-ttl-ms", "1000"],
        &["--lease", "etcd:http://h:2379", "--lease-ttl-ms", "0"],
        &["--lease", "consul:h"],
    ] {
        assert!(parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn vllm_launch_flags_set_tls_root_path_request_log_and_model_sources() {
    let cli = Cli::parse_from([
        "nitsum-router",
        "--root-path",
        "/api/",
        "--ssl-certfile",
        "c.pem",
        "--ssl-keyfile",
        "k.pem",
        "--disable-log-requests",
        "--tokenizer",
        "/tok",
        "--generation-config",
        "vllm",
    ]);
    let cfg = RouterConfig::from_cli(&cli).unwrap();
    assert_eq!(cfg.root_path.as_deref(), Some("/api"));
    let tls = cfg.tls.unwrap();
    assert_eq!(
        (tls.cert.as_path(), tls.key.as_path()),
        (Path::new("c.pem"), Path::new("k.pem"))
    );
    assert!(!cfg.log_requests && RouterConfig::default().log_requests);
    assert_eq!(cfg.tokenizer_dir.as_deref(), Some(Path::new("/tok")));
    assert_eq!(cfg.generation, crate::tokenize::GenerationSource::Builtin);
    for bad in [
        &["--ssl-certfile", "c.pem"][..],
        &["--root-path", "api"],
        &["--generation-config", "/no/such/dir"],
    ] {
        let cli = Cli::parse_from(std::iter::once("nitsum-router").chain(bad.iter().copied()));
        assert!(RouterConfig::from_cli(&cli).is_err(), "{bad:?}");
    }
}

#[test]
fn parser_flags_resolve_and_auto_tool_choice_needs_a_parser() {
    use crate::parsers::reasoning::ReasoningParser;
    use crate::parsers::tool_calls::ToolParser;
    let cli = Cli::parse_from([
        "nitsum-router",
        "--reasoning-parser",
        "deepseek_r1",
        "--tool-call-parser",
        "pythonic",
        "--enable-auto-tool-choice",
    ]);
    let p = RouterConfig::from_cli(&cli).unwrap().parsers;
    assert_eq!(p.reasoning, Some(ReasoningParser::DeepSeekR1));
    assert_eq!(p.auto_tools(), Some(ToolParser::Pythonic));
    let cli = Cli::parse_from(["nitsum-router", "--tool-call-parser", "hermes"]);
    let p = RouterConfig::from_cli(&cli).unwrap().parsers;
    assert_eq!(
        (p.tool_calls, p.auto_tools()),
        (Some(ToolParser::Hermes), None)
    );
    let cli = Cli::parse_from(["nitsum-router", "--enable-auto-tool-choice"]);
    let e = RouterConfig::from_cli(&cli).unwrap_err().to_string();
    assert_eq!(e, "--enable-auto-tool-choice requires --tool-call-parser");
    let cli = Cli::parse_from(["nitsum-router", "--reasoning-parser", "o1"]);
    let e = RouterConfig::from_cli(&cli).unwrap_err().to_string();
    assert_eq!(
        e,
        "--reasoning-parser: unknown parser `o1` (one of deepseek_r1, qwen3)"
    );
    let file: FileConfig = serde_json::from_str(
        r#"{"reasoning_parser": "qwen3", "tool_call_parser": "mistral",
            "enable_auto_tool_choice": true}"#,
    )
    .unwrap();
    let p = RouterConfig::from_file(file).unwrap().parsers;
    assert_eq!(
        (p.reasoning, p.auto_tools()),
        (Some(ReasoningParser::Qwen3), Some(ToolParser::Mistral))
    );
}
