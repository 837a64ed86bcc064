//! The control plane's credentials, made with Debian's `openssl`: a CA, the API server's
//! serving certificate (for its address, loopback and the `kubernetes` Service names), a
//! service-account signing key and a random admin token.

use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::ControlPlaneError;

#[derive(Debug, Clone)]
pub(crate) struct Credentials {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub service_account_key: PathBuf,
    pub token_file: PathBuf,
    pub token: String,
}

fn openssl(dir: &Path, args: &[&str]) -> Result<(), ControlPlaneError> {
    let command = || format!("openssl {}", args.join(" "));
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| ControlPlaneError::Command { command: command(), detail: e.to_string() })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(ControlPlaneError::Command {
            command: command(),
            detail: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

fn write(path: &Path, text: &str) -> Result<(), ControlPlaneError> {
    std::fs::write(path, text).map_err(|source| ControlPlaneError::File { what: "writing", path: path.into(), source })
}

fn random_token() -> Result<String, ControlPlaneError> {
    let path = Path::new("/dev/urandom");
    let mut bytes = [0u8; 16];
    std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut bytes))
        .map_err(|source| ControlPlaneError::File { what: "reading", path: path.into(), source })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Makes every credential in `dir`. `ips` go into the serving certificate besides loopback.
pub(crate) fn generate(dir: &Path, ips: &[IpAddr]) -> Result<Credentials, ControlPlaneError> {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "3650",
            "-subj",
            "/CN=svcplane-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ],
    )?;
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=kube-apiserver",
            "-keyout",
            "apiserver.key",
            "-out",
            "apiserver.csr",
        ],
    )?;
    let mut names = vec!["IP:127.0.0.1".to_owned(), "IP:::1".to_owned()];
    names.extend(ips.iter().map(|ip| format!("IP:{ip}")));
    for dns in [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ] {
        names.push(format!("DNS:{dns}"));
    }
    write(
        &dir.join("apiserver.ext"),
        &format!(
            "subjectAltName={}\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n",
            names.join(",")
        ),
    )?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "apiserver.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "3650",
            "-extfile",
            "apiserver.ext",
            "-out",
            "apiserver.crt",
        ],
    )?;
    openssl(dir, &["genrsa", "-out", "service-account.key", "2048"])?;
    let token = random_token()?;
    let token_file = dir.join("tokens.csv");
    write(&token_file, &format!("{token},admin,admin,\"system:masters\"\n"))?;
    Ok(Credentials {
        ca_cert: dir.join("ca.crt"),
        serving_cert: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        service_account_key: dir.join("service-account.key"),
        token_file,
        token,
    })
}
