//! The parsers replies are read with (`--reasoning-parser`, `--tool-call-parser`,
//! `--enable-auto-tool-choice`, or the config file's `reasoning_parser`, `tool_call_parser`,
//! `enable_auto_tool_choice`), as vLLM's flags of the same names.

use anyhow::{anyhow, bail, Result};

use crate::parsers::reasoning::ReasoningParser;
use crate::parsers::tool_calls::ToolParser;

/// The parsers replies are read with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutputParsers {
    /// Reasoning goes into `reasoning_content` (and Responses reasoning items).
    pub reasoning: Option<ReasoningParser>,
    /// The format calls the model chooses to make are read in.
    pub tool_calls: Option<ToolParser>,
    /// `tool_choice: "auto"` (and tools without `tool_choice`) is served; without it such a
    /// request is vLLM's 400. NOTE: needs `tool_calls` (checked by `check`).
    pub auto_tool_choice: bool,
}

impl OutputParsers {
    /// Apply parser names (None: leave as is) and the auto flag (true sets it).
    pub fn set(&mut self, reasoning: Option<&str>, tools: Option<&str>, auto: bool) -> Result<()> {
        if let Some(name) = reasoning {
            self.reasoning = Some(
                ReasoningParser::from_name(name)
                    .ok_or_else(|| unknown("--reasoning-parser", name, &ReasoningParser::NAMES))?,
            );
        }
        if let Some(name) = tools {
            self.tool_calls = Some(
                ToolParser::from_name(name)
                    .ok_or_else(|| unknown("--tool-call-parser", name, &ToolParser::NAMES))?,
            );
        }
        self.auto_tool_choice |= auto;
        Ok(())
    }

    /// Refuse `--enable-auto-tool-choice` without a parser (vLLM's startup error).
    pub fn check(&self) -> Result<()> {
        if self.auto_tool_choice && self.tool_calls.is_none() {
            bail!("--enable-auto-tool-choice requires --tool-call-parser");
        }
        Ok(())
    }

    /// The format `auto` calls are read in; None when `auto` is not served.
    pub fn auto_tools(&self) -> Option<ToolParser> {
        self.tool_calls.filter(|_| self.auto_tool_choice)
    }
}

fn unknown(flag: &str, name: &str, names: &[&str]) -> anyhow::Error {
    anyhow!(
        "{flag}: unknown parser `{name}` (one of {})",
        names.join(", ")
    )
}
