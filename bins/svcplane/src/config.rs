//! kube-proxy's configuration, read and written: the `KubeProxyConfiguration` file
//! (`kubeproxy.config.k8s.io/v1alpha1`, as kube-proxy v1.36 defines it) and kube-proxy's
//! flags, resolved with kube-proxy's precedence into one [`EffectiveConfig`] that `proxy`
//! and `render` use. Fields and flags that mean nothing to svcplane are named in one
//! warning each; unknown fields and bad values are errors naming the field.
//! See docs/configuration.md.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use ipnet::IpNet;
use serde::de::{self, DeserializeOwned, Deserializer};
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::cli::{Mode, ProxyArgs};

pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
pub const KIND: &str = "KubeProxyConfiguration";
/// The key `/configz` serves kube-proxy's configuration under.
pub const CONFIGZ_GROUP: &str = "kubeproxy.config.k8s.io";

const HEALTHZ_PORT: u16 = 10256;
const METRICS_PORT: u16 = 10249;
const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(30);
const DEFAULT_MIN_SYNC_PERIOD: Duration = Duration::from_secs(1);
const DEFAULT_OOM_SCORE_ADJ: i32 = -999;
const DEFAULT_MASQUERADE_BIT: i32 = 14;
const DEFAULT_CONFIG_SYNC_PERIOD: Duration = Duration::from_secs(15 * 60);
const DEFAULT_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

// ---------------------------------------------------------------------------------------
// Go durations (`metav1.Duration`): `30s`, `1m0s`, `500ms`, `2h22m`.
// ---------------------------------------------------------------------------------------

/// A duration written as Go writes them (`time.ParseDuration` / `Duration.String`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoDuration(pub Duration);

/// Parses Go's duration syntax; negative durations are refused (no field takes one).
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let not_a_duration = || format!("{text:?} is not a duration (e.g. 30s, 1m0s, 500ms)");
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if let Some(positive) = rest.strip_prefix('-') {
        let magnitude = parse_go_duration(positive).map_err(|_| not_a_duration())?;
        if magnitude.is_zero() {
            return Ok(Duration::ZERO);
        }
        return Err(format!("{text:?} is negative"));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(not_a_duration());
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (whole, after) = rest.split_at(digits);
        let (fraction, after) = match after.strip_prefix('.') {
            Some(after) => {
                let len = after.find(|c: char| !c.is_ascii_digit()).unwrap_or(after.len());
                after.split_at(len)
            }
            None => ("", after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(not_a_duration());
        }
        let unit_len = after.find(|c: char| c == '.' || c.is_ascii_digit()).unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(not_a_duration()),
        };
        let whole: u128 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| not_a_duration())? };
        let mut part = whole.checked_mul(scale).ok_or_else(not_a_duration)?;
        if !fraction.is_empty() {
            let digits = fraction.len().min(30) as u32;
            let value: u128 = fraction[..digits as usize].parse().map_err(|_| not_a_duration())?;
            part += value * scale / 10u128.pow(digits);
        }
        nanos = nanos.checked_add(part).ok_or_else(not_a_duration)?;
        rest = after;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| not_a_duration())?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// Writes a duration as Go's `Duration.String` does (`0s`, `500ms`, `1m0s`, `24h0m0s`).
pub fn format_go_duration(duration: Duration) -> String {
    fn decimal(value: u128, unit: u128, digits: usize) -> String {
        let (whole, rest) = (value / unit, value % unit);
        if rest == 0 {
            return whole.to_string();
        }
        let fraction = format!("{rest:0digits$}");
        format!("{whole}.{}", fraction.trim_end_matches('0'))
    }
    let nanos = duration.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", decimal(nanos, 1_000, 3));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", decimal(nanos, 1_000_000, 6));
    }
    let secs = nanos / 1_000_000_000;
    let (hours, minutes, seconds) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let mut text = String::new();
    if hours > 0 {
        text.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        text.push_str(&format!("{minutes}m"));
    }
    text.push_str(&decimal(seconds * 1_000_000_000 + nanos % 1_000_000_000, 1_000_000_000, 9));
    text.push('s');
    text
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_go_duration(self.0))
    }
}

impl Serialize for GoDuration {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = GoDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"30s\"")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<GoDuration, E> {
                parse_go_duration(text).map(GoDuration).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<GoDuration, E> {
                Err(E::custom(format!("{value} is not a duration: write it with a unit, e.g. \"{value}s\"")))
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<GoDuration, E> {
                Err(E::custom(format!("{value} is not a duration: write it with a unit, e.g. \"{value}s\"")))
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<GoDuration, E> {
                Err(E::custom(format!("{value} is not a duration: write it with a unit, e.g. \"{value}s\"")))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// `null` reads as the zero value, as Go's decoder leaves a non-pointer field alone.
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(deserializer: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

// ---------------------------------------------------------------------------------------
// The file: KubeProxyConfiguration v1alpha1 (fields in Go's JSON order: alphabetical, as
// kube-proxy writes them).
// ---------------------------------------------------------------------------------------

/// `KubeProxyConfiguration` of `kubeproxy.config.k8s.io/v1alpha1` (kube-proxy v1.36):
/// every field, so that a file kube-proxy accepts is read and one it refuses is refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeProxyConfiguration {
    #[serde(default, deserialize_with = "nullable")]
    pub api_version: String,
    #[serde(default, deserialize_with = "nullable")]
    pub bind_address: String,
    #[serde(default, deserialize_with = "nullable")]
    pub bind_address_hard_fail: bool,
    #[serde(default, deserialize_with = "nullable")]
    pub client_connection: ClientConnection,
    #[serde(rename = "clusterCIDR", default, deserialize_with = "nullable")]
    pub cluster_cidr: String,
    #[serde(default, deserialize_with = "nullable")]
    pub config_sync_period: GoDuration,
    #[serde(default, deserialize_with = "nullable")]
    pub conntrack: Conntrack,
    #[serde(default, deserialize_with = "nullable")]
    pub detect_local: DetectLocal,
    #[serde(default, deserialize_with = "nullable")]
    pub detect_local_mode: String,
    #[serde(default, deserialize_with = "nullable")]
    pub enable_profiling: bool,
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    #[serde(default, deserialize_with = "nullable")]
    pub healthz_bind_address: String,
    #[serde(default, deserialize_with = "nullable")]
    pub hostname_override: String,
    #[serde(default, deserialize_with = "nullable")]
    pub iptables: IptablesSection,
    #[serde(default, deserialize_with = "nullable")]
    pub ipvs: IpvsSection,
    #[serde(default, deserialize_with = "nullable")]
    pub kind: String,
    #[serde(default, deserialize_with = "nullable")]
    pub logging: Logging,
    #[serde(default, deserialize_with = "nullable")]
    pub metrics_bind_address: String,
    #[serde(default, deserialize_with = "nullable")]
    pub mode: String,
    #[serde(default)]
    pub nftables: NftablesSection,
    #[serde(default)]
    pub node_port_addresses: Option<Vec<String>>,
    #[serde(default)]
    pub oom_score_adj: Option<i32>,
    #[serde(default, deserialize_with = "nullable")]
    pub port_range: String,
    #[serde(default, deserialize_with = "nullable")]
    pub show_hidden_metrics_for_version: String,
    #[serde(default, deserialize_with = "nullable")]
    pub winkernel: Winkernel,
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "is_false")]
    pub windows_run_as_service: bool,
}

/// A float as Go's JSON writes it: `5`, not `5.0`.
fn go_float<S: serde::Serializer>(value: &f32, serializer: S) -> Result<S::Ok, S::Error> {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        serializer.serialize_i64(*value as i64)
    } else {
        serializer.serialize_f32(*value)
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// `clientConnection` (component-base's `ClientConnectionConfiguration`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientConnection {
    #[serde(default, deserialize_with = "nullable")]
    pub accept_content_types: String,
    #[serde(default, deserialize_with = "nullable")]
    pub burst: i32,
    #[serde(default, deserialize_with = "nullable")]
    pub content_type: String,
    #[serde(default, deserialize_with = "nullable")]
    pub kubeconfig: String,
    #[serde(default, deserialize_with = "nullable", serialize_with = "go_float")]
    pub qps: f32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Conntrack {
    #[serde(default)]
    pub max_per_core: Option<i32>,
    #[serde(default)]
    pub min: Option<i32>,
    #[serde(default, deserialize_with = "nullable")]
    pub tcp_be_liberal: bool,
    #[serde(default)]
    pub tcp_close_wait_timeout: Option<GoDuration>,
    #[serde(default)]
    pub tcp_established_timeout: Option<GoDuration>,
    #[serde(default, deserialize_with = "nullable")]
    pub udp_stream_timeout: GoDuration,
    #[serde(default, deserialize_with = "nullable")]
    pub udp_timeout: GoDuration,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DetectLocal {
    #[serde(default, deserialize_with = "nullable")]
    pub bridge_interface: String,
    #[serde(default, deserialize_with = "nullable")]
    pub interface_name_prefix: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IptablesSection {
    #[serde(default)]
    pub localhost_node_ports: Option<bool>,
    #[serde(default, deserialize_with = "nullable")]
    pub masquerade_all: bool,
    #[serde(default)]
    pub masquerade_bit: Option<i32>,
    #[serde(default, deserialize_with = "nullable")]
    pub min_sync_period: GoDuration,
    #[serde(default, deserialize_with = "nullable")]
    pub sync_period: GoDuration,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpvsSection {
    #[serde(rename = "excludeCIDRs", default)]
    pub exclude_cidrs: Option<Vec<String>>,
    #[serde(default, deserialize_with = "nullable")]
    pub min_sync_period: GoDuration,
    #[serde(default, deserialize_with = "nullable")]
    pub scheduler: String,
    #[serde(rename = "strictARP", default, deserialize_with = "nullable")]
    pub strict_arp: bool,
    #[serde(default, deserialize_with = "nullable")]
    pub sync_period: GoDuration,
    #[serde(default, deserialize_with = "nullable")]
    pub tcp_fin_timeout: GoDuration,
    #[serde(default, deserialize_with = "nullable")]
    pub tcp_timeout: GoDuration,
    #[serde(default, deserialize_with = "nullable")]
    pub udp_timeout: GoDuration,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NftablesSection {
    #[serde(default, deserialize_with = "nullable")]
    pub masquerade_all: bool,
    #[serde(default)]
    pub masquerade_bit: Option<i32>,
    #[serde(default, deserialize_with = "nullable")]
    pub min_sync_period: GoDuration,
    #[serde(default, deserialize_with = "nullable")]
    pub sync_period: GoDuration,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Winkernel {
    #[serde(rename = "enableDSR", default, deserialize_with = "nullable")]
    pub enable_dsr: bool,
    #[serde(default, deserialize_with = "nullable")]
    pub forward_health_check_vip: bool,
    #[serde(default, deserialize_with = "nullable")]
    pub network_name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub root_hns_endpoint_name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub source_vip: String,
}

/// `logging` (component-base's `LoggingConfiguration`): read so files are accepted; svcplane
/// logs at the level `SVCPLANE_LOG` sets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Logging {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_frequency: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<LoggingOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbosity: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmodule: Option<Vec<VModule>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoggingOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<FormatOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<FormatOptions>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FormatOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info_buffer_size: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_stream: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VModule {
    #[serde(default)]
    pub file_pattern: String,
    #[serde(default)]
    pub verbosity: u32,
}

impl Logging {
    /// component-base's recommended logging settings, as kube-proxy fills them in.
    fn set_defaults(&mut self) {
        let zero = match &self.flush_frequency {
            None | Some(serde_json::Value::Null) => true,
            Some(serde_json::Value::Number(n)) => n.as_f64() == Some(0.0),
            Some(serde_json::Value::String(s)) => s.is_empty() || parse_go_duration(s).is_ok_and(|d| d.is_zero()),
            _ => false,
        };
        if zero {
            self.flush_frequency = Some(serde_json::Value::String("5s".to_owned()));
        }
        if self.format.as_deref().is_none_or(str::is_empty) {
            self.format = Some("text".to_owned());
        }
        self.verbosity.get_or_insert(0);
        let options = self.options.get_or_insert_with(LoggingOptions::default);
        for format in [&mut options.json, &mut options.text] {
            let format = format.get_or_insert_with(FormatOptions::default);
            format.info_buffer_size.get_or_insert_with(|| serde_json::Value::String("0".to_owned()));
        }
    }

    /// The logging fields set to something other than their zero value.
    fn set_fields(&self) -> Vec<&'static str> {
        let zero = |value: &Option<serde_json::Value>| match value {
            None | Some(serde_json::Value::Null) => true,
            Some(serde_json::Value::Number(n)) => n.as_f64() == Some(0.0),
            Some(serde_json::Value::String(s)) => s.is_empty() || s == "0" || s == "0s",
            _ => false,
        };
        let options_zero = |options: &Option<FormatOptions>| {
            options.as_ref().is_none_or(|o| zero(&o.info_buffer_size) && !o.split_stream.unwrap_or(false))
        };
        let mut set = Vec::new();
        if self.format.as_deref().is_some_and(|f| !f.is_empty() && f != "text") {
            set.push("logging.format");
        }
        // kube-proxy's default is 5s (written as "5s" or in nanoseconds).
        let default_flush = |value: &Option<serde_json::Value>| match value {
            Some(serde_json::Value::String(s)) => s == "5s",
            Some(serde_json::Value::Number(n)) => n.as_u64() == Some(5_000_000_000),
            _ => false,
        };
        if !zero(&self.flush_frequency) && !default_flush(&self.flush_frequency) {
            set.push("logging.flushFrequency");
        }
        if self.verbosity.unwrap_or(0) != 0 {
            set.push("logging.verbosity");
        }
        if self.vmodule.as_ref().is_some_and(|v| !v.is_empty()) {
            set.push("logging.vmodule");
        }
        if self.options.as_ref().is_some_and(|o| !options_zero(&o.text) || !options_zero(&o.json)) {
            set.push("logging.options");
        }
        set
    }
}

/// Reads YAML (or JSON, which YAML includes), naming the field an error is about.
fn parse_document<T: DeserializeOwned>(text: &str) -> anyhow::Result<T> {
    let mut path = None;
    let mut options = serde_saphyr::Options::default();
    options.with_snippet = false;
    let result = serde_saphyr::with_deserializer_from_str_with_options(text, options, |deserializer| {
        serde_path_to_error::deserialize(deserializer).map_err(|error| {
            let mut text = error.path().to_string();
            while let Some(parent) = text.strip_suffix(".?") {
                text.truncate(parent.len());
            }
            if text != "." && text != "?" {
                path = Some(text);
            }
            error.into_inner()
        })
    });
    result.map_err(|error| {
        let reason = error.to_string();
        match path {
            Some(path) => anyhow::anyhow!("{path}: {reason}"),
            None => anyhow::anyhow!("{reason}"),
        }
    })
}

impl KubeProxyConfiguration {
    /// Reads a configuration file: the type must be v1alpha1's, every field known.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        // The type first, so a file of another kind is named as such rather than by its
        // first unknown field.
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct TypeMeta {
            #[serde(default)]
            api_version: Option<String>,
            #[serde(default)]
            kind: Option<String>,
        }
        let meta: TypeMeta = parse_document(text)?;
        match meta.api_version.as_deref() {
            Some(API_VERSION) => {}
            Some(other) => bail!("apiVersion: {other:?} is not {API_VERSION} (the only version svcplane reads)"),
            None => bail!("apiVersion: missing (want {API_VERSION})"),
        }
        match meta.kind.as_deref() {
            Some(KIND) => {}
            Some(other) => bail!("kind: {other:?} is not {KIND}"),
            None => bail!("kind: missing (want {KIND})"),
        }
        parse_document(text)
    }

    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text)
    }

    /// kube-proxy's defaults (its `SetDefaults_KubeProxyConfiguration`): zero values become
    /// the defaults, as when kube-proxy reads a file.
    pub fn set_defaults(&mut self) {
        self.api_version = API_VERSION.to_owned();
        self.kind = KIND.to_owned();
        if self.detect_local_mode.is_empty() {
            self.detect_local_mode = "ClusterCIDR".to_owned();
        }
        if self.bind_address.is_empty() {
            self.bind_address = "0.0.0.0".to_owned();
        }
        let ipv6 = self.bind_address.parse::<IpAddr>().is_ok_and(|ip| ip.is_ipv6());
        let (healthz_host, metrics_host) = if ipv6 { ("[::]", "[::1]") } else { ("0.0.0.0", "127.0.0.1") };
        self.healthz_bind_address = with_default_port(&self.healthz_bind_address, healthz_host, HEALTHZ_PORT);
        self.metrics_bind_address = with_default_port(&self.metrics_bind_address, metrics_host, METRICS_PORT);
        self.oom_score_adj.get_or_insert(DEFAULT_OOM_SCORE_ADJ);
        for (sync, min_sync) in [
            (&mut self.iptables.sync_period, &mut self.iptables.min_sync_period),
            (&mut self.ipvs.sync_period, &mut self.ipvs.min_sync_period),
            (&mut self.nftables.sync_period, &mut self.nftables.min_sync_period),
        ] {
            if sync.0.is_zero() {
                *sync = GoDuration(DEFAULT_SYNC_PERIOD);
            }
            if min_sync.0.is_zero() {
                *min_sync = GoDuration(DEFAULT_MIN_SYNC_PERIOD);
            }
        }
        self.iptables.masquerade_bit.get_or_insert(DEFAULT_MASQUERADE_BIT);
        self.iptables.localhost_node_ports.get_or_insert(true);
        self.logging.set_defaults();
        self.nftables.masquerade_bit.get_or_insert(DEFAULT_MASQUERADE_BIT);
        self.conntrack.max_per_core.get_or_insert(32 * 1024);
        self.conntrack.min.get_or_insert(128 * 1024);
        self.conntrack.tcp_established_timeout.get_or_insert(GoDuration(Duration::from_secs(24 * 3600)));
        self.conntrack.tcp_close_wait_timeout.get_or_insert(GoDuration(Duration::from_secs(3600)));
        if self.config_sync_period.0.is_zero() {
            self.config_sync_period = GoDuration(DEFAULT_CONFIG_SYNC_PERIOD);
        }
        if self.client_connection.content_type.is_empty() {
            self.client_connection.content_type = DEFAULT_CONTENT_TYPE.to_owned();
        }
        if self.client_connection.qps == 0.0 {
            self.client_connection.qps = 5.0;
        }
        if self.client_connection.burst == 0 {
            self.client_connection.burst = 10;
        }
    }

    /// The section of `mode` that holds the sync periods (kube-proxy: ipvs, nftables, else
    /// iptables).
    fn sync_section(&self, mode: Mode) -> (&'static str, GoDuration, GoDuration) {
        match mode {
            Mode::Ipvs => ("ipvs", self.ipvs.sync_period, self.ipvs.min_sync_period),
            Mode::Nftables => ("nftables", self.nftables.sync_period, self.nftables.min_sync_period),
            Mode::Iptables | Mode::Ebpf | Mode::Userspace => {
                ("iptables", self.iptables.sync_period, self.iptables.min_sync_period)
            }
        }
    }

    fn set_sync_periods(&mut self, mode: Mode, sync: Option<Duration>, min_sync: Option<Duration>) {
        let (sync_field, min_field) = match mode {
            Mode::Ipvs => (&mut self.ipvs.sync_period, &mut self.ipvs.min_sync_period),
            Mode::Nftables => (&mut self.nftables.sync_period, &mut self.nftables.min_sync_period),
            Mode::Iptables | Mode::Ebpf | Mode::Userspace => {
                (&mut self.iptables.sync_period, &mut self.iptables.min_sync_period)
            }
        };
        if let Some(sync) = sync {
            *sync_field = GoDuration(sync);
        }
        if let Some(min_sync) = min_sync {
            *min_field = GoDuration(min_sync);
        }
    }

    /// The YAML kube-proxy's `--write-config-to` writes.
    pub fn to_yaml(&self) -> anyhow::Result<String> {
        let mut text = serde_saphyr::to_string(self).context("writing the configuration as YAML")?;
        if !text.ends_with('\n') {
            text.push('\n');
        }
        Ok(text)
    }
}

/// `host:port` from `IP:PORT`, `IP` (the default port) or empty (the default address).
fn with_default_port(value: &str, default_host: &str, port: u16) -> String {
    if value.is_empty() {
        return format!("{default_host}:{port}");
    }
    let bare = value.strip_prefix('[').and_then(|v| v.strip_suffix(']')).unwrap_or(value);
    match bare.parse::<IpAddr>() {
        Ok(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        Ok(IpAddr::V4(ip)) => format!("{ip}:{port}"),
        Err(_) => value.to_owned(),
    }
}

/// A bind address: `IP:PORT`, `[IPv6]:PORT` or a bare IP (then `default_port`); empty is
/// "disabled".
pub fn parse_bind_address(value: &str, default_port: u16) -> Result<Option<SocketAddr>, String> {
    if value.is_empty() {
        return Ok(None);
    }
    if let Ok(address) = value.parse::<SocketAddr>() {
        return Ok(Some(address));
    }
    let bare = value.strip_prefix('[').and_then(|v| v.strip_suffix(']')).unwrap_or(value);
    bare.parse::<IpAddr>()
        .map(|ip| Some(SocketAddr::new(ip, default_port)))
        .map_err(|_| format!("{value:?} is not IP:PORT (or an IP)"))
}

/// A mode as kube-proxy spells it; empty is kube-proxy's Linux default, iptables.
fn parse_mode(value: &str) -> Result<Mode, String> {
    match value {
        "" | "iptables" => Ok(Mode::Iptables),
        "nftables" => Ok(Mode::Nftables),
        "ipvs" => Ok(Mode::Ipvs),
        "ebpf" => Ok(Mode::Ebpf),
        "userspace" => Ok(Mode::Userspace),
        "kernelspace" => Err(format!("{value:?} is kube-proxy's Windows mode; svcplane runs on Linux")),
        _ => Err(format!("{value:?} is not a proxy mode (nftables, iptables, ipvs, ebpf, userspace)")),
    }
}

pub fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Nftables => "nftables",
        Mode::Iptables => "iptables",
        Mode::Ipvs => "ipvs",
        Mode::Ebpf => "ebpf",
        Mode::Userspace => "userspace",
    }
}

/// A flag's duration: Go syntax, or plain seconds (svcplane's older IPVS timeout flags).
fn parse_flag_duration(flag: &str, value: &str) -> anyhow::Result<Duration> {
    if let Ok(seconds) = value.parse::<u64>()
        && flag.starts_with("--ipvs-")
        && flag.ends_with("-timeout")
    {
        return Ok(Duration::from_secs(seconds));
    }
    parse_go_duration(value).map_err(|reason| anyhow::anyhow!("{flag}: {reason}"))
}

// ---------------------------------------------------------------------------------------
// The effective configuration.
// ---------------------------------------------------------------------------------------

/// The IPVS settings of `--mode ipvs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsSettings {
    pub scheduler: String,
    /// Zero: leave the kernel's.
    pub tcp_timeout: Duration,
    pub tcp_fin_timeout: Duration,
    pub udp_timeout: Duration,
    /// `ipvs.excludeCIDRs`: virtual services there are never removed.
    pub exclude_cidrs: Vec<IpNet>,
    /// `ipvs.strictARP`.
    pub strict_arp: bool,
}

/// What `proxy` runs with: flags and `--config` resolved with kube-proxy's precedence.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveConfig {
    /// This node, as in Pod.spec.nodeName.
    pub node_name: String,
    pub mode: Mode,
    /// The pod network (kube-proxy's `clusterCIDR`, `detectLocalMode: ClusterCIDR`).
    pub cluster_cidrs: Vec<IpNet>,
    /// CIDRs, or the single `primary`; empty: every node address but loopback.
    pub nodeport_addresses: Vec<String>,
    /// `clientConnection.kubeconfig` / `--kubeconfig`; `None`: in-cluster (or `--manifests`).
    pub kubeconfig: Option<PathBuf>,
    /// kube-proxy's health server (`/healthz`, `/livez`); `None`: disabled.
    pub healthz_bind_address: Option<SocketAddr>,
    /// kube-proxy's metrics server (`/metrics`, `/configz`); `None`: disabled.
    pub metrics_bind_address: Option<SocketAddr>,
    /// Whether failing to bind the health or metrics port ends the proxy.
    pub bind_address_hard_fail: bool,
    /// kube-proxy's `syncPeriod`: the longest time between full resyncs. svcplane's sync
    /// loop checks for drift on every turn and has no periodic resync, so this is not a
    /// loop setting; it is what the health server's staleness timeout derives from
    /// (2 x sync period, as kube-proxy's `/healthz`).
    pub sync_period: Duration,
    /// The shortest time between two syncs (`LoopSettings::min_sync_interval`).
    pub min_sync_period: Duration,
    /// Written to /proc/self/oom_score_adj when the proxy starts.
    pub oom_score_adj: i32,
    pub ipvs: IpvsSettings,
    /// The fields and flags that mean nothing to svcplane, each named once.
    pub warnings: Vec<String>,
    /// The whole configuration in kube-proxy's shape (defaults, then flags or the file).
    pub kube_proxy: KubeProxyConfiguration,
}

impl EffectiveConfig {
    /// Resolves the flags and `--config`, then logs one warning per field or flag svcplane
    /// does not apply.
    pub fn resolve(args: &ProxyArgs) -> anyhow::Result<Self> {
        let effective = Self::resolve_quietly(args)?;
        for warning in &effective.warnings {
            warn!("{warning}");
        }
        Ok(effective)
    }

    /// As [`Self::resolve`], without logging.
    pub fn resolve_quietly(args: &ProxyArgs) -> anyhow::Result<Self> {
        let mut warnings = Vec::new();
        let flags = &args.kube_proxy;
        let config = match &args.config {
            Some(path) => {
                let mut config =
                    KubeProxyConfiguration::read(path).with_context(|| format!("--config {}", path.display()))?;
                config.set_defaults();
                // kube-proxy ignores its other flags when --config is given.
                for flag in flags_config_overrides(args) {
                    warnings.push(format!("{flag} is ignored: --config is given and the file wins, as in kube-proxy"));
                }
                config
            }
            None => Self::config_from_flags(args)?,
        };
        let describe = |error: anyhow::Error| match &args.config {
            Some(path) => error.context(format!("--config {}", path.display())),
            None => error,
        };
        let mut effective = Self::from_kube_proxy(config, args).map_err(describe)?;
        if args.config.is_none() {
            for flag in args.kube_proxy.ignored.given() {
                if flag == "--detect-local-mode"
                    && matches!(flags.ignored.detect_local_mode(), Some("" | "ClusterCIDR"))
                {
                    continue;
                }
                warnings.push(format!("{flag} is not applied: {}", flag_reason(flag)));
            }
        }
        if flags.verbosity.is_some() {
            warnings.push(
                "-v/--v is not applied: svcplane's log level is SVCPLANE_LOG (e.g. SVCPLANE_LOG=debug)".to_owned(),
            );
        }
        warnings.append(&mut effective.warnings);
        let mut seen = std::collections::BTreeSet::new();
        warnings.retain(|warning| seen.insert(warning.clone()));
        effective.warnings = warnings;
        Ok(effective)
    }

    /// kube-proxy without `--config`: the defaults, then the flags written over them.
    fn config_from_flags(args: &ProxyArgs) -> anyhow::Result<KubeProxyConfiguration> {
        let flags = &args.kube_proxy;
        let mut config = KubeProxyConfiguration::default();
        config.set_defaults();
        // svcplane's own default mode, when no flag names one, is nftables.
        let mode = match &args.mode_flag {
            Some(value) => parse_mode(value).map_err(|reason| anyhow::anyhow!("--mode: {reason}"))?,
            None => Mode::Nftables,
        };
        config.mode = mode_name(mode).to_owned();
        if args.mode_flag.as_deref() == Some("") {
            config.mode = String::new();
        }
        config.cluster_cidr = args.cluster_cidrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        for value in &args.nodeport_addresses {
            if value == "primary" && args.nodeport_addresses.len() > 1 {
                bail!("--nodeport-addresses: `primary` cannot be combined with CIDRs");
            }
            if value != "primary" && value.parse::<IpNet>().is_err() {
                bail!("--nodeport-addresses: {value:?} is not a CIDR or `primary`");
            }
        }
        if !args.nodeport_addresses.is_empty() {
            config.node_port_addresses = Some(args.nodeport_addresses.clone());
        }
        if let Some(path) = &args.source.kubeconfig {
            config.client_connection.kubeconfig = path.display().to_string();
        }
        if let Some(name) = args.node_name_flag.as_deref().filter(|name| !name.is_empty()) {
            config.hostname_override = name.to_owned();
        }
        if let Some(value) = &flags.healthz_bind_address {
            parse_bind_address(value, HEALTHZ_PORT).map_err(|r| anyhow::anyhow!("--healthz-bind-address: {r}"))?;
            config.healthz_bind_address =
                if value.is_empty() { String::new() } else { with_default_port(value, "", HEALTHZ_PORT) };
        }
        if let Some(value) = &flags.metrics_bind_address {
            parse_bind_address(value, METRICS_PORT).map_err(|r| anyhow::anyhow!("--metrics-bind-address: {r}"))?;
            config.metrics_bind_address =
                if value.is_empty() { String::new() } else { with_default_port(value, "", METRICS_PORT) };
        }
        // The deprecated port flags: 0 disables the server, another port replaces the
        // address's.
        for (port, address) in [
            (flags.healthz_port, &mut config.healthz_bind_address),
            (flags.metrics_port, &mut config.metrics_bind_address),
        ] {
            match port {
                Some(0) => address.clear(),
                Some(port) if !address.is_empty() => {
                    if let Ok(parsed) = address.parse::<SocketAddr>() {
                        *address = SocketAddr::new(parsed.ip(), port).to_string();
                    }
                }
                _ => {}
            }
        }
        if let Some(hard_fail) = flags.bind_address_hard_fail {
            config.bind_address_hard_fail = hard_fail;
        }
        // kube-proxy's --iptables-* periods apply to every mode but ipvs, --ipvs-* to ipvs
        // only; svcplane's --sync-period / --min-sync-period to whichever mode runs, first.
        let (sync_flags, min_sync_flags) = if mode == Mode::Ipvs {
            (
                [("--sync-period", &flags.sync_period), ("--ipvs-sync-period", &flags.ipvs_sync_period)],
                [
                    ("--min-sync-period", &flags.min_sync_period),
                    ("--ipvs-min-sync-period", &flags.ipvs_min_sync_period),
                ],
            )
        } else {
            (
                [("--sync-period", &flags.sync_period), ("--iptables-sync-period", &flags.iptables_sync_period)],
                [
                    ("--min-sync-period", &flags.min_sync_period),
                    ("--iptables-min-sync-period", &flags.iptables_min_sync_period),
                ],
            )
        };
        let first = |candidates: [(&str, &Option<String>); 2]| {
            candidates
                .into_iter()
                .find_map(|(flag, value)| value.as_deref().map(|value| parse_flag_duration(flag, value)))
                .transpose()
        };
        let (sync, min_sync) = (first(sync_flags)?, first(min_sync_flags)?);
        if sync.is_some_and(|s| s.is_zero()) {
            bail!("--sync-period: must be greater than 0");
        }
        let (_, default_sync, default_min) = config.sync_section(mode);
        let (effective_sync, effective_min) = (sync.unwrap_or(default_sync.0), min_sync.unwrap_or(default_min.0));
        if effective_sync < effective_min {
            bail!(
                "--sync-period: {} must be at least --min-sync-period ({})",
                format_go_duration(effective_sync),
                format_go_duration(effective_min)
            );
        }
        config.set_sync_periods(mode, sync, min_sync);
        if let Some(adj) = flags.oom_score_adj {
            if !(-1000..=1000).contains(&adj) {
                bail!("--oom-score-adj: {adj} is not within -1000..=1000");
            }
            config.oom_score_adj = Some(adj);
        }
        if let Some(scheduler) = &args.ipvs_scheduler_flag {
            config.ipvs.scheduler = scheduler.clone();
        }
        if let Some(cidrs) = &args.ipvs_exclude_cidrs_flag {
            for cidr in cidrs {
                if cidr.trim().parse::<IpNet>().is_err() {
                    bail!("--ipvs-exclude-cidrs: {cidr:?} is not a CIDR");
                }
            }
            config.ipvs.exclude_cidrs = Some(cidrs.iter().map(|cidr| cidr.trim().to_owned()).collect());
        }
        if let Some(strict_arp) = args.ipvs_strict_arp_flag {
            config.ipvs.strict_arp = strict_arp;
        }
        for (flag, value, field) in [
            ("--ipvs-tcp-timeout", &args.ipvs_tcp_timeout_flag, &mut config.ipvs.tcp_timeout),
            ("--ipvs-tcpfin-timeout", &args.ipvs_tcpfin_timeout_flag, &mut config.ipvs.tcp_fin_timeout),
            ("--ipvs-udp-timeout", &args.ipvs_udp_timeout_flag, &mut config.ipvs.udp_timeout),
        ] {
            if let Some(value) = value {
                *field = GoDuration(parse_flag_duration(flag, value)?);
            }
        }
        let ignored = &flags.ignored;
        for (flag, value, field) in [
            (
                "--conntrack-tcp-timeout-established",
                &ignored.conntrack_tcp_timeout_established,
                &mut config.conntrack.tcp_established_timeout,
            ),
            (
                "--conntrack-tcp-timeout-close-wait",
                &ignored.conntrack_tcp_timeout_close_wait,
                &mut config.conntrack.tcp_close_wait_timeout,
            ),
        ] {
            if let Some(value) = value {
                *field = Some(GoDuration(parse_flag_duration(flag, value)?));
            }
        }
        for (flag, value, field) in [
            ("--conntrack-udp-timeout", &ignored.conntrack_udp_timeout, &mut config.conntrack.udp_timeout),
            (
                "--conntrack-udp-timeout-stream",
                &ignored.conntrack_udp_timeout_stream,
                &mut config.conntrack.udp_stream_timeout,
            ),
        ] {
            if let Some(value) = value {
                *field = GoDuration(parse_flag_duration(flag, value)?);
            }
        }
        if let Some(value) = &ignored.conntrack_tcp_be_liberal {
            config.conntrack.tcp_be_liberal = value
                .parse()
                .map_err(|_| anyhow::anyhow!("--conntrack-tcp-be-liberal: {value:?} is not true or false"))?;
        }
        Ok(config)
    }

    /// The effective settings from a defaulted configuration; errors name the field.
    fn from_kube_proxy(mut config: KubeProxyConfiguration, args: &ProxyArgs) -> anyhow::Result<Self> {
        let mut warnings = Vec::new();
        let mode = parse_mode(&config.mode).map_err(|reason| anyhow::anyhow!("mode: {reason}"))?;
        // --hostname-override / --node-name win over the file, as kube-proxy's
        // --hostname-override does.
        // An empty flag is no flag, as kube-proxy's `--hostname-override=""`.
        if let Some(name) = args.node_name_flag.as_deref().filter(|name| !name.is_empty()) {
            let name = name.trim();
            if name.is_empty() {
                bail!("--hostname-override: an empty node name is invalid");
            }
            config.hostname_override = name.to_lowercase();
        }
        let node_name = if config.hostname_override.trim().is_empty() {
            machine_hostname().context("hostnameOverride is empty and the machine's hostname is unknown")?
        } else {
            config.hostname_override.trim().to_lowercase()
        };
        let cluster_cidrs = config
            .cluster_cidr
            .split(',')
            .map(str::trim)
            .filter(|cidr| !cidr.is_empty())
            .map(|cidr| cidr.parse::<IpNet>().map_err(|_| anyhow::anyhow!("clusterCIDR: {cidr:?} is not a CIDR")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        if cluster_cidrs.len() > 2
            || (cluster_cidrs.len() == 2 && cluster_cidrs[0].addr().is_ipv4() == cluster_cidrs[1].addr().is_ipv4())
        {
            bail!("clusterCIDR: {:?}: at most one CIDR per IP family", config.cluster_cidr);
        }
        let nodeport_addresses = config.node_port_addresses.clone().unwrap_or_default();
        for (index, value) in nodeport_addresses.iter().enumerate() {
            if value == "primary" {
                if nodeport_addresses.len() > 1 {
                    bail!("nodePortAddresses[{index}]: `primary` cannot be combined with CIDRs");
                }
            } else if value.parse::<IpNet>().is_err() {
                bail!("nodePortAddresses[{index}]: {value:?} is not a CIDR or `primary`");
            }
        }
        let healthz_bind_address = parse_bind_address(&config.healthz_bind_address, HEALTHZ_PORT)
            .map_err(|reason| anyhow::anyhow!("healthzBindAddress: {reason}"))?;
        let metrics_bind_address = parse_bind_address(&config.metrics_bind_address, METRICS_PORT)
            .map_err(|reason| anyhow::anyhow!("metricsBindAddress: {reason}"))?;
        if !config.bind_address.is_empty() && config.bind_address.parse::<IpAddr>().is_err() {
            bail!("bindAddress: {:?} is not an IP address", config.bind_address);
        }
        let (section, sync, min_sync) = config.sync_section(mode);
        if sync.0.is_zero() {
            bail!("{section}.syncPeriod: must be greater than 0");
        }
        if sync < min_sync {
            bail!("{section}.syncPeriod: {sync} must be greater than or equal to {section}.minSyncPeriod ({min_sync})");
        }
        let oom_score_adj = config.oom_score_adj.unwrap_or(DEFAULT_OOM_SCORE_ADJ);
        if !(-1000..=1000).contains(&oom_score_adj) {
            bail!("oomScoreAdj: {oom_score_adj} is not within -1000..=1000");
        }
        for (field, bit) in [
            ("iptables.masqueradeBit", config.iptables.masquerade_bit),
            ("nftables.masqueradeBit", config.nftables.masquerade_bit),
        ] {
            if let Some(bit) = bit
                && !(0..=31).contains(&bit)
            {
                bail!("{field}: {bit} is not within 0..=31");
            }
        }
        match config.detect_local_mode.as_str() {
            "" | "ClusterCIDR" => {}
            "NodeCIDR" | "BridgeInterface" | "InterfaceNamePrefix" => warnings.push(format!(
                "detectLocalMode: {:?} is not applied: svcplane tells pod traffic by clusterCIDR only",
                config.detect_local_mode
            )),
            other => bail!(
                "detectLocalMode: {other:?} is not one of ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix"
            ),
        }
        let scheduler = if config.ipvs.scheduler.is_empty() { "rr".to_owned() } else { config.ipvs.scheduler.clone() };
        if mode == Mode::Ipvs && !svcplane_backend_ipvs::SCHEDULERS.contains(&scheduler.as_str()) {
            bail!("ipvs.scheduler: {scheduler:?} is not one of {}", svcplane_backend_ipvs::SCHEDULERS.join(", "));
        }
        let mut exclude_cidrs = Vec::new();
        for (index, cidr) in config.ipvs.exclude_cidrs.iter().flatten().enumerate() {
            match cidr.trim().parse::<IpNet>() {
                Ok(net) => exclude_cidrs.push(net),
                Err(_) => bail!("ipvs.excludeCIDRs[{index}]: {cidr:?} is not a CIDR"),
            }
        }
        warnings.extend(not_applied(&config, mode));
        let kubeconfig = (!config.client_connection.kubeconfig.is_empty())
            .then(|| PathBuf::from(&config.client_connection.kubeconfig));
        Ok(Self {
            node_name,
            mode,
            cluster_cidrs,
            nodeport_addresses,
            kubeconfig,
            healthz_bind_address,
            metrics_bind_address,
            bind_address_hard_fail: config.bind_address_hard_fail,
            sync_period: sync.0,
            min_sync_period: min_sync.0,
            oom_score_adj,
            ipvs: IpvsSettings {
                scheduler,
                tcp_timeout: config.ipvs.tcp_timeout.0,
                tcp_fin_timeout: config.ipvs.tcp_fin_timeout.0,
                udp_timeout: config.ipvs.udp_timeout.0,
                exclude_cidrs,
                strict_arp: config.ipvs.strict_arp,
            },
            warnings,
            kube_proxy: config,
        })
    }

    /// `args` with the settings `modes.rs` and the feeds read replaced by the effective
    /// ones (mode, IPVS settings, node, pod network, NodePort addresses, kubeconfig).
    pub fn apply_to(&self, args: &ProxyArgs) -> ProxyArgs {
        let mut resolved = args.clone();
        resolved.mode = self.mode;
        resolved.node_name_flag = Some(self.node_name.clone());
        resolved.cluster_cidrs = self.cluster_cidrs.clone();
        resolved.nodeport_addresses = self.nodeport_addresses.clone();
        resolved.ipvs_scheduler = self.ipvs.scheduler.clone();
        let seconds = |d: Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
        resolved.ipvs_tcp_timeout = seconds(self.ipvs.tcp_timeout);
        resolved.ipvs_tcpfin_timeout = seconds(self.ipvs.tcp_fin_timeout);
        resolved.ipvs_udp_timeout = seconds(self.ipvs.udp_timeout);
        resolved.ipvs_exclude_cidrs = self.ipvs.exclude_cidrs.clone();
        resolved.ipvs_strict_arp = self.ipvs.strict_arp;
        // --manifests is svcplane's own and has no field in the file: it stays the source.
        if resolved.source.manifests.is_none() {
            resolved.source.kubeconfig = self.kubeconfig.clone();
        }
        resolved
    }

    /// kube-proxy's `--write-config-to`: the effective configuration as a
    /// `KubeProxyConfiguration` file.
    pub fn write_config(&self, path: &Path) -> anyhow::Result<()> {
        let text = self.kube_proxy.to_yaml()?;
        std::fs::write(path, text).with_context(|| format!("--write-config-to {}", path.display()))
    }

    /// What kube-proxy's `/configz` serves: `{"kubeproxy.config.k8s.io": {...}}`, the
    /// configuration in kube-proxy's internal shape (Go field names, sync periods at the
    /// top, the pod network as a list).
    pub fn to_configz_json(&self) -> serde_json::Value {
        use serde_json::json;
        let c = &self.kube_proxy;
        let duration = |d: GoDuration| json!(d.to_string());
        let masquerade_all =
            if self.mode == Mode::Nftables { c.nftables.masquerade_all } else { c.iptables.masquerade_all };
        let cluster_cidrs: Vec<String> = self.cluster_cidrs.iter().map(ToString::to_string).collect();
        let logging = serde_json::to_value(&c.logging).unwrap_or_else(|_| json!({}));
        json!({
            CONFIGZ_GROUP: {
                "Linux": {
                    "Conntrack": {
                        "MaxPerCore": c.conntrack.max_per_core,
                        "Min": c.conntrack.min,
                        "TCPEstablishedTimeout": c.conntrack.tcp_established_timeout.map(duration),
                        "TCPCloseWaitTimeout": c.conntrack.tcp_close_wait_timeout.map(duration),
                        "TCPBeLiberal": c.conntrack.tcp_be_liberal,
                        "UDPTimeout": duration(c.conntrack.udp_timeout),
                        "UDPStreamTimeout": duration(c.conntrack.udp_stream_timeout),
                    },
                    "MasqueradeAll": masquerade_all,
                    "OOMScoreAdj": self.oom_score_adj,
                },
                "Windows": { "RunAsService": c.windows_run_as_service },
                "FeatureGates": c.feature_gates,
                "ClientConnection": {
                    "Kubeconfig": c.client_connection.kubeconfig,
                    "AcceptContentTypes": c.client_connection.accept_content_types,
                    "ContentType": c.client_connection.content_type,
                    "QPS": c.client_connection.qps,
                    "Burst": c.client_connection.burst,
                },
                "Logging": logging,
                "HostnameOverride": c.hostname_override,
                "BindAddress": c.bind_address,
                "HealthzBindAddress": c.healthz_bind_address,
                "MetricsBindAddress": c.metrics_bind_address,
                "BindAddressHardFail": c.bind_address_hard_fail,
                "EnableProfiling": c.enable_profiling,
                "ShowHiddenMetricsForVersion": c.show_hidden_metrics_for_version,
                "Mode": c.mode,
                "IPTables": {
                    "MasqueradeBit": c.iptables.masquerade_bit,
                    "LocalhostNodePorts": c.iptables.localhost_node_ports,
                },
                "IPVS": {
                    "Scheduler": c.ipvs.scheduler,
                    "ExcludeCIDRs": c.ipvs.exclude_cidrs,
                    "StrictARP": c.ipvs.strict_arp,
                    "TCPTimeout": duration(c.ipvs.tcp_timeout),
                    "TCPFinTimeout": duration(c.ipvs.tcp_fin_timeout),
                    "UDPTimeout": duration(c.ipvs.udp_timeout),
                },
                "Winkernel": {
                    "NetworkName": c.winkernel.network_name,
                    "SourceVip": c.winkernel.source_vip,
                    "EnableDSR": c.winkernel.enable_dsr,
                    "RootHnsEndpointName": c.winkernel.root_hns_endpoint_name,
                    "ForwardHealthCheckVip": c.winkernel.forward_health_check_vip,
                },
                "NFTables": { "MasqueradeBit": c.nftables.masquerade_bit },
                "DetectLocalMode": c.detect_local_mode,
                "DetectLocal": {
                    "BridgeInterface": c.detect_local.bridge_interface,
                    "ClusterCIDRs": cluster_cidrs,
                    "InterfaceNamePrefix": c.detect_local.interface_name_prefix,
                },
                "NodePortAddresses": c.node_port_addresses,
                "SyncPeriod": format_go_duration(self.sync_period),
                "MinSyncPeriod": format_go_duration(self.min_sync_period),
                "ConfigSyncPeriod": duration(c.config_sync_period),
            }
        })
    }

    /// Sets the conntrack timeouts kube-proxy sets (sysctls of this network namespace, each
    /// only when its value is above zero and differs); a failure names the field in a
    /// warning. `maxPerCore` / `min` (nf_conntrack_max, node-wide) are not applied.
    pub fn apply_conntrack(&self) {
        let c = &self.kube_proxy.conntrack;
        let seconds = |d: Option<GoDuration>| d.map(|d| d.0.as_secs()).filter(|s| *s > 0);
        let settings = [
            (
                "conntrack.tcpEstablishedTimeout",
                "nf_conntrack_tcp_timeout_established",
                seconds(c.tcp_established_timeout),
            ),
            ("conntrack.tcpCloseWaitTimeout", "nf_conntrack_tcp_timeout_close_wait", seconds(c.tcp_close_wait_timeout)),
            ("conntrack.tcpBeLiberal", "nf_conntrack_tcp_be_liberal", c.tcp_be_liberal.then_some(1)),
            ("conntrack.udpTimeout", "nf_conntrack_udp_timeout", seconds(Some(c.udp_timeout))),
            ("conntrack.udpStreamTimeout", "nf_conntrack_udp_timeout_stream", seconds(Some(c.udp_stream_timeout))),
        ];
        for (field, name, value) in settings {
            let Some(value) = value else { continue };
            let path = format!("/proc/sys/net/netfilter/{name}");
            if std::fs::read_to_string(&path).is_ok_and(|current| current.trim() == value.to_string()) {
                continue;
            }
            match std::fs::write(&path, value.to_string()) {
                Ok(()) => tracing::info!("{field}: {name} set to {value}"),
                Err(error) => warn!("{field} is not applied: writing {value} to {path}: {error}"),
            }
        }
    }

    /// Writes `oom_score_adj` for this process, as kube-proxy does at start; a failure
    /// (no CAP_SYS_RESOURCE for a negative value, a read-only /proc) is a warning.
    pub fn apply_oom_score_adj(&self) {
        if let Err(error) = std::fs::write("/proc/self/oom_score_adj", self.oom_score_adj.to_string()) {
            warn!(oom_score_adj = self.oom_score_adj, "oomScoreAdj: could not write /proc/self/oom_score_adj: {error}");
        }
    }
}

/// The flags kube-proxy binds to configuration fields, given on this command line: with
/// `--config` they are ignored (the file wins).
fn flags_config_overrides(args: &ProxyArgs) -> Vec<&'static str> {
    let f = &args.kube_proxy;
    let mut given = Vec::new();
    let mut check = |name: &'static str, is_given: bool| {
        if is_given {
            given.push(name);
        }
    };
    check("--mode/--proxy-mode", args.mode_flag.is_some());
    check("--cluster-cidr", !args.cluster_cidrs.is_empty());
    check("--nodeport-addresses", !args.nodeport_addresses.is_empty());
    check("--kubeconfig", args.source.kubeconfig.is_some());
    check("--healthz-bind-address", f.healthz_bind_address.is_some());
    check("--metrics-bind-address", f.metrics_bind_address.is_some());
    check("--healthz-port", f.healthz_port.is_some());
    check("--metrics-port", f.metrics_port.is_some());
    check("--bind-address-hard-fail", f.bind_address_hard_fail.is_some());
    check("--sync-period", f.sync_period.is_some());
    check("--min-sync-period", f.min_sync_period.is_some());
    check("--iptables-sync-period", f.iptables_sync_period.is_some());
    check("--iptables-min-sync-period", f.iptables_min_sync_period.is_some());
    check("--ipvs-sync-period", f.ipvs_sync_period.is_some());
    check("--ipvs-min-sync-period", f.ipvs_min_sync_period.is_some());
    check("--oom-score-adj", f.oom_score_adj.is_some());
    check("--ipvs-scheduler", args.ipvs_scheduler_flag.is_some());
    check("--ipvs-tcp-timeout", args.ipvs_tcp_timeout_flag.is_some());
    check("--ipvs-tcpfin-timeout", args.ipvs_tcpfin_timeout_flag.is_some());
    check("--ipvs-udp-timeout", args.ipvs_udp_timeout_flag.is_some());
    check("--ipvs-exclude-cidrs", args.ipvs_exclude_cidrs_flag.is_some());
    check("--ipvs-strict-arp", args.ipvs_strict_arp_flag.is_some());
    let ignored = &f.ignored;
    check("--conntrack-tcp-timeout-established", ignored.conntrack_tcp_timeout_established.is_some());
    check("--conntrack-tcp-timeout-close-wait", ignored.conntrack_tcp_timeout_close_wait.is_some());
    check("--conntrack-tcp-be-liberal", ignored.conntrack_tcp_be_liberal.is_some());
    check("--conntrack-udp-timeout", ignored.conntrack_udp_timeout.is_some());
    check("--conntrack-udp-timeout-stream", ignored.conntrack_udp_timeout_stream.is_some());
    given.extend(f.ignored.given());
    given
}

/// Why a kube-proxy flag svcplane accepts does nothing.
fn flag_reason(flag: &str) -> &'static str {
    match flag {
        "--masquerade-all" => "svcplane masquerades by its own rules (off-cluster sources, hairpin)",
        "--iptables-masquerade-bit" => "svcplane's rules keep their own mark",
        "--iptables-localhost-nodeports" => "svcplane never answers NodePorts on loopback",
        f if f.starts_with("--conntrack-") => "nf_conntrack_max is node-wide and svcplane leaves it as it is",
        "--profiling" => "svcplane serves no pprof",
        "--feature-gates" => "svcplane has no feature gates",
        "--detect-local-mode" | "--pod-bridge-interface" | "--pod-interface-name-prefix" => {
            "svcplane tells pod traffic by --cluster-cidr only"
        }
        "--bind-address" => "svcplane takes the node's addresses from the Node object or --node-ip",
        "--config-sync-period" => "svcplane's watches do not resync on a timer",
        "--kube-api-qps" | "--kube-api-burst" | "--kube-api-content-type" => {
            "svcplane's API client sets its own rate and content type"
        }
        "--master" => "the API server comes from the kubeconfig",
        "--show-hidden-metrics-for-version" => "svcplane hides no metrics",
        _ => "svcplane's log level and format are SVCPLANE_LOG's",
    }
}

/// One warning per field set (to other than kube-proxy's default) that svcplane does not
/// apply.
fn not_applied(c: &KubeProxyConfiguration, mode: Mode) -> Vec<String> {
    let mut out = Vec::new();
    let mut field = |name: &str, set: bool, why: &str| {
        if set {
            out.push(format!("{name} is not applied: {why}"));
        }
    };
    field("featureGates", !c.feature_gates.is_empty(), "svcplane has no feature gates");
    field(
        "clientConnection.acceptContentTypes",
        !c.client_connection.accept_content_types.is_empty(),
        "svcplane's API client chooses its content types",
    );
    field(
        "clientConnection.contentType",
        c.client_connection.content_type != DEFAULT_CONTENT_TYPE,
        "svcplane's API client chooses its content type",
    );
    field("clientConnection.qps", c.client_connection.qps != 5.0, "svcplane's API client sets its own rate");
    field("clientConnection.burst", c.client_connection.burst != 10, "svcplane's API client sets its own rate");
    for name in c.logging.set_fields() {
        field(name, true, "svcplane's log level and format are SVCPLANE_LOG's");
    }
    let specific_bind = c.bind_address.parse::<IpAddr>().is_ok_and(|ip| !ip.is_unspecified());
    field("bindAddress", specific_bind, "svcplane takes the node's addresses from the Node object or --node-ip");
    field("enableProfiling", c.enable_profiling, "svcplane serves no pprof");
    field("showHiddenMetricsForVersion", !c.show_hidden_metrics_for_version.is_empty(), "svcplane hides no metrics");
    let masquerade_bit_why = "svcplane's rules keep their own mark (nftables mode marks nothing)";
    field("iptables.masqueradeBit", c.iptables.masquerade_bit != Some(DEFAULT_MASQUERADE_BIT), masquerade_bit_why);
    field("nftables.masqueradeBit", c.nftables.masquerade_bit != Some(DEFAULT_MASQUERADE_BIT), masquerade_bit_why);
    let masquerade_all_why = "svcplane masquerades by its own rules (off-cluster sources, hairpin)";
    field("iptables.masqueradeAll", c.iptables.masquerade_all, masquerade_all_why);
    field("nftables.masqueradeAll", c.nftables.masquerade_all, masquerade_all_why);
    // kube-proxy's iptables mode answers NodePorts on 127.0.0.1 unless this is false (its
    // default is true); svcplane never does.
    field(
        "iptables.localhostNodePorts",
        mode == Mode::Iptables && c.iptables.localhost_node_ports != Some(false),
        "svcplane never answers NodePorts on loopback (as kube-proxy with `false`)",
    );
    let winkernel = "kube-proxy's Windows mode; svcplane runs on Linux";
    field("winkernel.networkName", !c.winkernel.network_name.is_empty(), winkernel);
    field("winkernel.sourceVip", !c.winkernel.source_vip.is_empty(), winkernel);
    field("winkernel.enableDSR", c.winkernel.enable_dsr, winkernel);
    field("winkernel.rootHnsEndpointName", !c.winkernel.root_hns_endpoint_name.is_empty(), winkernel);
    field("winkernel.forwardHealthCheckVip", c.winkernel.forward_health_check_vip, winkernel);
    field("windowsRunAsService", c.windows_run_as_service, winkernel);
    let detect = "svcplane tells pod traffic by clusterCIDR only";
    field("detectLocal.bridgeInterface", !c.detect_local.bridge_interface.is_empty(), detect);
    field("detectLocal.interfaceNamePrefix", !c.detect_local.interface_name_prefix.is_empty(), detect);
    field("portRange", !c.port_range.is_empty(), "unused by kube-proxy too (the userspace proxy is gone)");
    field(
        "configSyncPeriod",
        c.config_sync_period.0 != DEFAULT_CONFIG_SYNC_PERIOD,
        "svcplane's watches do not resync on a timer",
    );
    // The timeouts are applied (`EffectiveConfig::apply_conntrack`); the table size is a
    // node-wide setting svcplane leaves alone.
    let conntrack = "svcplane leaves the node's nf_conntrack_max as it is";
    field("conntrack.maxPerCore", c.conntrack.max_per_core.is_some_and(|v| v != 0 && v != 32 * 1024), conntrack);
    field("conntrack.min", c.conntrack.min.is_some_and(|v| v != 0 && v != 128 * 1024), conntrack);
    out
}

/// The machine's hostname, lower-cased (kube-proxy's node name without an override).
pub(crate) fn machine_hostname() -> anyhow::Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("reading /proc/sys/kernel/hostname")?
        .trim()
        .to_lowercase();
    if name.is_empty() {
        bail!("the hostname is empty");
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn args(extra: &[&str]) -> ProxyArgs {
        let mut argv = vec!["svcplane", "render", "--manifests", "/nonexistent"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).expect("flags parse").command {
            Command::Render(args) => args,
            _ => unreachable!(),
        }
    }

    fn with_file(text: &str, extra: &[&str]) -> anyhow::Result<EffectiveConfig> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, text).unwrap();
        let mut flags = vec!["--config", path.to_str().unwrap()];
        flags.extend_from_slice(extra);
        EffectiveConfig::resolve_quietly(&args(&flags))
    }

    const MINIMAL: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

    #[test]
    fn go_durations_read_and_write_as_go_does() {
        for (text, duration) in [
            ("30s", Duration::from_secs(30)),
            ("1m0s", Duration::from_secs(60)),
            ("500ms", Duration::from_millis(500)),
            ("2h22m", Duration::from_secs(2 * 3600 + 22 * 60)),
            ("1.5s", Duration::from_millis(1500)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("250µs", Duration::from_micros(250)),
        ] {
            assert_eq!(parse_go_duration(text), Ok(duration), "{text}");
        }
        for bad in ["30x", "", "s", "1", "-1s", "1h-2m", "1..5s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?} parsed");
        }
        for (duration, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_secs(24 * 3600), "24h0m0s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(15 * 60), "15m0s"),
        ] {
            assert_eq!(format_go_duration(duration), text);
            assert_eq!(parse_go_duration(text), Ok(duration));
        }
    }

    #[test]
    fn an_empty_file_of_the_right_type_gives_kube_proxy_defaults_and_iptables_mode() {
        let effective = with_file(MINIMAL, &["--hostname-override", "Node1"]).unwrap();
        assert_eq!(effective.node_name, "node1");
        assert_eq!(effective.mode, Mode::Iptables);
        assert_eq!(effective.healthz_bind_address, Some("0.0.0.0:10256".parse().unwrap()));
        assert_eq!(effective.metrics_bind_address, Some("127.0.0.1:10249".parse().unwrap()));
        assert_eq!(effective.sync_period, Duration::from_secs(30));
        assert_eq!(effective.min_sync_period, Duration::from_secs(1));
        assert_eq!(effective.oom_score_adj, -999);
        // kube-proxy's iptables mode would answer NodePorts on loopback; svcplane says it won't.
        assert_eq!(effective.warnings.len(), 1, "{:?}", effective.warnings);
        assert!(effective.warnings[0].starts_with("iptables.localhostNodePorts"), "{:?}", effective.warnings);
    }

    #[test]
    fn unknown_fields_and_bad_values_name_the_field() {
        let unknown = with_file(&format!("{MINIMAL}nftables:\n  syncPeriods: 30s\n"), &[]).unwrap_err();
        assert!(format!("{unknown:#}").contains("nftables.syncPeriods"), "{unknown:#}");
        let duration = with_file(&format!("{MINIMAL}nftables:\n  syncPeriod: 30x\n"), &[]).unwrap_err();
        let text = format!("{duration:#}");
        assert!(text.contains("nftables.syncPeriod: \"30x\" is not a duration"), "{text}");
        assert!(text.starts_with("--config "), "{text}");
        let cidr = with_file(&format!("{MINIMAL}clusterCIDR: 10.0.0.0/33\n"), &["--node-name", "n"]).unwrap_err();
        assert!(format!("{cidr:#}").contains("clusterCIDR: \"10.0.0.0/33\" is not a CIDR"), "{cidr:#}");
        let mode = with_file(&format!("{MINIMAL}mode: winkernel\n"), &["--node-name", "n"]).unwrap_err();
        assert!(format!("{mode:#}").contains("mode: \"winkernel\" is not a proxy mode"), "{mode:#}");
        let version =
            with_file("apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n", &[]).unwrap_err();
        assert!(format!("{version:#}").contains("apiVersion: \"kubeproxy.config.k8s.io/v1alpha2\""), "{version:#}");
        let kind =
            with_file("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n", &[]).unwrap_err();
        assert!(format!("{kind:#}").contains("kind: \"KubeletConfiguration\""), "{kind:#}");
    }

    #[test]
    fn json_files_are_read_too() {
        let text = r#"{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","mode":"nftables","clusterCIDR":"10.244.0.0/16,fd00::/48","hostnameOverride":"a"}"#;
        let effective = with_file(text, &[]).unwrap();
        assert_eq!(effective.mode, Mode::Nftables);
        assert_eq!(effective.cluster_cidrs.len(), 2);
        assert_eq!(effective.node_name, "a");
    }

    #[test]
    fn the_file_wins_over_flags_but_hostname_override_wins_over_the_file() {
        let text = format!(
            "{MINIMAL}mode: ipvs\nhostnameOverride: from-file\nclusterCIDR: 10.244.0.0/16\nipvs:\n  syncPeriod: 1m0s\n  minSyncPeriod: 2s\n"
        );
        let effective = with_file(
            &text,
            &["--proxy-mode", "nftables", "--cluster-cidr", "10.1.0.0/16", "--hostname-override", "From-Flag"],
        )
        .unwrap();
        assert_eq!(effective.mode, Mode::Ipvs);
        assert_eq!(effective.cluster_cidrs, vec!["10.244.0.0/16".parse::<IpNet>().unwrap()]);
        assert_eq!(effective.node_name, "from-flag");
        assert_eq!(
            (effective.sync_period, effective.min_sync_period),
            (Duration::from_secs(60), Duration::from_secs(2))
        );
        assert_eq!(
            effective.warnings.iter().filter(|w| w.contains("--mode/--proxy-mode is ignored")).count(),
            1,
            "{:?}",
            effective.warnings
        );
        let without_override = with_file(&text, &[]).unwrap();
        assert_eq!(without_override.node_name, "from-file");
    }

    #[test]
    fn kube_proxy_flags_resolve_without_a_file() {
        let effective = EffectiveConfig::resolve_quietly(&args(&[
            "--hostname-override=node1",
            "--proxy-mode=iptables",
            "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
            "--nodeport-addresses=198.18.0.0/15,2001:db8::/32",
            "--healthz-bind-address=0.0.0.0",
            "--metrics-bind-address=",
            "--iptables-sync-period=1m0s",
            "--iptables-min-sync-period=500ms",
            "--oom-score-adj=-998",
            "--bind-address-hard-fail",
            "--masquerade-all",
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-close-wait=30m",
            "--detect-local-mode=ClusterCIDR",
            "--v=2",
        ]))
        .unwrap();
        assert_eq!(effective.mode, Mode::Iptables);
        assert_eq!(effective.cluster_cidrs.len(), 2);
        assert_eq!(effective.nodeport_addresses, vec!["198.18.0.0/15", "2001:db8::/32"]);
        assert_eq!(effective.healthz_bind_address, Some("0.0.0.0:10256".parse().unwrap()));
        assert_eq!(effective.metrics_bind_address, None);
        assert_eq!(effective.sync_period, Duration::from_secs(60));
        assert_eq!(effective.min_sync_period, Duration::from_millis(500));
        assert_eq!(effective.oom_score_adj, -998);
        assert!(effective.bind_address_hard_fail);
        let close_wait = effective.kube_proxy.conntrack.tcp_close_wait_timeout;
        assert_eq!(close_wait, Some(GoDuration(Duration::from_secs(30 * 60))));
        let names: Vec<_> = effective.warnings.iter().map(|w| w.split(' ').next().unwrap()).collect();
        assert_eq!(
            names,
            vec!["--masquerade-all", "--conntrack-max-per-core", "-v/--v", "iptables.localhostNodePorts"],
            "{:?}",
            effective.warnings
        );
    }

    #[test]
    fn kube_proxys_mode_specific_sync_flags_apply_to_their_modes_only() {
        let flags = ["--node-name=n", "--iptables-sync-period=45s", "--ipvs-sync-period=50s"];
        let nftables = EffectiveConfig::resolve_quietly(&args(&[&flags[..], &["--mode=nftables"]].concat())).unwrap();
        assert_eq!(nftables.sync_period, Duration::from_secs(45));
        let ipvs = EffectiveConfig::resolve_quietly(&args(&[&flags[..], &["--mode=ipvs"]].concat())).unwrap();
        assert_eq!(ipvs.sync_period, Duration::from_secs(50));
        let ours =
            EffectiveConfig::resolve_quietly(&args(&[&flags[..], &["--mode=ipvs", "--sync-period=1m"]].concat()))
                .unwrap();
        assert_eq!(ours.sync_period, Duration::from_secs(60));
    }

    #[test]
    fn bad_flag_values_name_the_flag() {
        for (flags, expected) in [
            (&["--nodeport-addresses=everywhere"][..], "--nodeport-addresses: \"everywhere\""),
            (
                &["--sync-period=1s", "--min-sync-period=2s"][..],
                "--sync-period: 1s must be at least --min-sync-period (2s)",
            ),
            (&["--oom-score-adj=-1001"][..], "--oom-score-adj: -1001"),
            (&["--min-sync-period=1x"][..], "--min-sync-period: \"1x\" is not a duration"),
            (&["--mode=winkernel"][..], "--mode: \"winkernel\" is not a proxy mode"),
            (&["--healthz-bind-address=localhost:1"][..], "--healthz-bind-address: \"localhost:1\""),
        ] {
            let mut all = vec!["--node-name=n"];
            all.extend_from_slice(flags);
            let error = EffectiveConfig::resolve_quietly(&args(&all)).unwrap_err();
            assert!(format!("{error:#}").contains(expected), "{flags:?}: {error:#}");
        }
    }

    #[test]
    fn without_flags_svcplane_keeps_its_own_default_mode() {
        let effective = EffectiveConfig::resolve_quietly(&args(&["--node-name", "n"])).unwrap();
        assert_eq!(effective.mode, Mode::Nftables);
        assert_eq!(effective.kube_proxy.mode, "nftables");
        let empty = EffectiveConfig::resolve_quietly(&args(&["--node-name", "n", "--proxy-mode="])).unwrap();
        assert_eq!(empty.mode, Mode::Iptables);
    }

    #[test]
    fn a_non_applicable_field_is_named_in_exactly_one_warning() {
        let effective =
            with_file(&format!("{MINIMAL}mode: ipvs\nhostnameOverride: n\nenableProfiling: true\n"), &[]).unwrap();
        assert_eq!(effective.warnings.len(), 1, "{:?}", effective.warnings);
        assert!(effective.warnings[0].starts_with("enableProfiling is not applied"));
    }

    #[test]
    fn ipvs_strict_arp_and_excluded_cidrs_are_applied_from_the_file_and_from_flags() {
        let body = format!(
            "{MINIMAL}mode: ipvs\nhostnameOverride: n\nipvs:\n  strictARP: true\n  excludeCIDRs: [198.18.200.0/24, 2001:db8:ff::/64]\n"
        );
        let effective = with_file(&body, &[]).unwrap();
        assert!(effective.warnings.is_empty(), "{:?}", effective.warnings);
        assert!(effective.ipvs.strict_arp);
        let expected: Vec<IpNet> = vec!["198.18.200.0/24".parse().unwrap(), "2001:db8:ff::/64".parse().unwrap()];
        assert_eq!(effective.ipvs.exclude_cidrs, expected);
        let from_flags = EffectiveConfig::resolve_quietly(&args(&[
            "--node-name=n",
            "--mode=ipvs",
            "--ipvs-strict-arp",
            "--ipvs-exclude-cidrs=198.18.200.0/24,2001:db8:ff::/64",
        ]))
        .unwrap();
        assert!(from_flags.warnings.is_empty(), "{:?}", from_flags.warnings);
        assert!(from_flags.ipvs.strict_arp);
        assert_eq!(from_flags.ipvs.exclude_cidrs, expected);
        let resolved = from_flags.apply_to(&args(&["--node-name=n"]));
        assert!(resolved.ipvs_strict_arp);
        assert_eq!(resolved.ipvs_exclude_cidrs, expected);
        let error =
            EffectiveConfig::resolve_quietly(&args(&["--node-name=n", "--ipvs-exclude-cidrs=nope"])).unwrap_err();
        assert!(format!("{error:#}").contains("--ipvs-exclude-cidrs: \"nope\" is not a CIDR"), "{error:#}");
    }

    #[test]
    fn written_config_reads_back_to_the_same_effective_config() {
        let from_flags = EffectiveConfig::resolve_quietly(&args(&[
            "--node-name=node1",
            "--mode=ipvs",
            "--cluster-cidr=198.18.128.0/17",
            "--ipvs-scheduler=lc",
            "--ipvs-tcp-timeout=900",
            "--sync-period=45s",
            "--min-sync-period=2s",
            "--healthz-bind-address=[::1]:1234",
        ]))
        .unwrap();
        assert_eq!(from_flags.ipvs.tcp_timeout, Duration::from_secs(900));
        let yaml = from_flags.kube_proxy.to_yaml().unwrap();
        let read_back = with_file(&yaml, &[]).unwrap();
        assert_eq!(read_back, from_flags, "{yaml}");
        assert_eq!(read_back.kube_proxy.to_yaml().unwrap(), yaml);
    }

    #[test]
    fn configz_is_the_internal_shape_under_the_group_name() {
        let effective = with_file(&format!("{MINIMAL}hostnameOverride: n\nclusterCIDR: 10.244.0.0/16\n"), &[]).unwrap();
        let configz = effective.to_configz_json();
        let inner = &configz[CONFIGZ_GROUP];
        assert_eq!(inner["SyncPeriod"], "30s");
        assert_eq!(inner["MinSyncPeriod"], "1s");
        assert_eq!(inner["Linux"]["OOMScoreAdj"], -999);
        assert_eq!(inner["DetectLocal"]["ClusterCIDRs"][0], "10.244.0.0/16");
        assert_eq!(inner["HealthzBindAddress"], "0.0.0.0:10256");
        assert_eq!(inner["ClientConnection"]["ContentType"], DEFAULT_CONTENT_TYPE);
    }
}
