//! Where a server's `/metrics` is served: beside its API, on a listener of its own, or nowhere.

use std::net::SocketAddr;

use anyhow::Context;

/// Where `/metrics` is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsListen {
    /// On the main listener, beside the API.
    Main,
    /// Nowhere.
    Off,
    /// On a listener of its own.
    Own(SocketAddr),
}

impl MetricsListen {
    /// Parses the setting `name`: empty = on the main listener, `off` = nowhere, `host:port` =
    /// a listener of its own.
    pub fn parse(name: &str, setting: &str) -> anyhow::Result<MetricsListen> {
        Ok(match setting.trim() {
            "" => MetricsListen::Main,
            "off" => MetricsListen::Off,
            addr => MetricsListen::Own(
                addr.parse()
                    .with_context(|| format!("{name} {addr:?} is empty, \"off\" or host:port"))?,
            ),
        })
    }
}
