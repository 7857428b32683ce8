//! Wiring: config → model files → engine → transport → heartbeat reaper → lease loop (several
//! routers) → control loop (with a profile) → HTTP server.
//! `main` (the binary) and `nitsum._core.router_main` (Python) both call [`cli_main`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use tokio::task::JoinHandle;

use crate::api::{self, AppState};
use crate::config::{Cli, RouterConfig};
use crate::mock_worker::{self, MockOptions, MockWorker};
use crate::state::RouterState;
use crate::tokenize::{ModelFiles, ModelSources};
use crate::transport::{self, Transport};
use crate::worker_auth::{check_policy, WorkerSecret};

/// A router running inside the current tokio runtime.
pub struct Running {
    /// Bound HTTP address.
    pub http_addr: SocketAddr,
    /// Bound worker endpoint (e.g. `tcp://127.0.0.1:5557`).
    pub worker_endpoint: String,
    pub router: Arc<RouterState>,
    pub transport: Transport,
    pub http: JoinHandle<()>,
    pub reaper: JoinHandle<()>,
    /// The control loop (with `--profile`).
    pub control: Option<JoinHandle<()>>,
    /// The lease loop (several routers, with `--lease`).
    pub routers: Option<crate::routers::Routers>,
    pub mocks: Vec<MockWorker>,
}

impl Running {
    /// Shutdown, first half: refuse new requests (503 `shutting_down`), give those in flight
    /// up to `timeout` to finish, then end the rest with an explicit error (never a cut
    /// stream). Returns how many had to be ended.
    pub async fn drain(&self, timeout: Duration) -> usize {
        self.router.start_draining();
        let deadline = Instant::now() + timeout;
        while self.router.inflight() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = self.router.inflight();
        if left > 0 {
            self.router
                .fail_all("the server shut down before this request finished");
            // Let the handlers write the error events out.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        left
    }

    /// Stop every task of this router.
    pub fn stop(&self) {
        self.http.abort();
        self.reaper.abort();
        if let Some(c) = &self.control {
            c.abort();
        }
        if let Some(r) = &self.routers {
            r.abort();
        }
        self.transport.abort();
        for m in &self.mocks {
            m.kill();
        }
    }
}

/// Load the model directory named by the config, if any.
pub fn load_model(cfg: &RouterConfig) -> Result<Option<Arc<ModelFiles>>> {
    let Some(model_dir) = cfg.model_dir.as_deref() else {
        return Ok(None);
    };
    let sources = ModelSources {
        model_dir,
        tokenizer_dir: cfg.tokenizer_dir.as_deref(),
        chat_template: cfg.chat_template.as_deref(),
        generation: &cfg.generation,
    };
    Ok(Some(Arc::new(ModelFiles::load_from(sources)?)))
}

/// Start transport, reaper, optional mock workers and the HTTP server.
pub async fn start(mut cfg: RouterConfig, model: Option<Arc<ModelFiles>>) -> Result<Running> {
    let profile = crate::control_loop::load_profile(&cfg)?;
    if cfg.worker_secret.is_none() && !cfg.insecure_worker_plane && cfg.mock_workers > 0 {
        // In-process mock workers only: a secret nobody else knows.
        cfg.worker_secret = Some(WorkerSecret::generate());
    }
    check_policy(
        cfg.worker_secret.as_ref(),
        cfg.insecure_worker_plane,
        &cfg.worker_addr,
    )?;
    let cfg = Arc::new(cfg);
    let (engine, outbound) = RouterState::new(cfg.clone());
    let transport = transport::start(&cfg.worker_addr, engine.clone(), outbound).await?;
    let worker_endpoint = transport.endpoint.clone();
    let reaper = {
        let engine = engine.clone();
        // Check four times per timeout so a dead worker is noticed within 1.25 timeouts.
        let period = (engine.heartbeat_timeout() / 4).max(Duration::from_millis(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                engine.reap_dead(Instant::now());
                engine.flush_refusal_log(Instant::now());
            }
        })
    };
    let routers = crate::routers::spawn(engine.clone(), &worker_endpoint)?;
    let control = profile.map(|p| {
        tracing::info!(
            window_ms = cfg.control_window_ms,
            device = %p.device,
            model = %p.model,
            "control loop on"
        );
        crate::control_loop::spawn(engine.clone(), p)
    });
    let mut mocks = Vec::new();
    if cfg.mock_workers > 0 {
        let opts = MockOptions {
            eos_token_ids: model
                .as_ref()
                .map(|m| m.eos_token_ids.clone())
                .unwrap_or_default(),
            model: cfg.served_model_name.clone(),
            secret: cfg.worker_secret.clone(),
            ..MockOptions::default()
        };
        mocks = mock_worker::spawn_many(&worker_endpoint, cfg.mock_workers, &opts).await?;
    }
    let listener = api::listen::bind(&cfg.listen)
        .await
        .with_context(|| format!("binding HTTP at {}", cfg.listen))?;
    let http_addr = listener.local_addr()?;
    let app = api::router(AppState::new(engine.clone(), model));
    let how = api::listen::Listening {
        read_timeout: Duration::from_millis(cfg.client_read_timeout_ms),
        tls: cfg.tls.as_ref().map(api::tls::acceptor).transpose()?,
        root_path: cfg.root_path.as_deref().map(Arc::from),
    };
    let scheme = if how.tls.is_some() { "https" } else { "http" };
    let http = tokio::spawn(api::listen::serve(listener, app, how));
    tracing::info!(%http_addr, scheme, worker_endpoint = %worker_endpoint, "nitsum-router listening");
    Ok(Running {
        http_addr,
        worker_endpoint,
        router: engine,
        transport,
        http,
        reaper,
        control,
        routers,
        mocks,
    })
}

/// Run until SIGINT or SIGTERM, then drain (`Running::drain`) and stop.
pub async fn serve(cfg: RouterConfig) -> Result<()> {
    let model = load_model(&cfg)?;
    let shutdown_workers = cfg.shutdown_workers_on_exit;
    let drain = Duration::from_millis(cfg.drain_timeout_ms);
    let mut running = start(cfg, model).await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C")?,
        _ = term.recv() => {}
    }
    tracing::info!(
        inflight = running.router.inflight(),
        "shutting down: draining"
    );
    // NOTE: give the lease up first: another router plans while this one drains.
    if let Some(r) = running.routers.take() {
        r.release().await;
    }
    let ended = running.drain(drain).await;
    tracing::info!(ended, "drained");
    if shutdown_workers {
        running.router.shutdown_workers();
        // Give the send loop a moment to flush.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.stop();
    Ok(())
}

/// The `nitsum-router` entry point: parse `args` (argv including the program name), run,
/// return the process exit code.
pub fn cli_main<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    crate::heap::init();
    let level = cli.log_level.parse().unwrap_or(tracing::Level::INFO);
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_target(false)
        .try_init();
    let result = RouterConfig::from_cli(&cli).and_then(|cfg| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the tokio runtime")?
            .block_on(serve(cfg))
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("nitsum-router: {e:#}");
            1
        }
    }
}
