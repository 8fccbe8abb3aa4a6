//! The network of a `silt-faults` run: one network namespace per node, each with a veth link
//! to a bridge in the harness's own namespace (where its clients run), and nftables rules in
//! each node's namespace that drop what a fault says.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

/// The bridge the nodes' links meet on; the harness reaches the nodes through it.
const BRIDGE: &str = "silt-br0";
/// The harness's address on the bridge.
pub(crate) const HARNESS_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

/// Runs a command and fails with what it printed when it fails.
pub(crate) fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!("{program} {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// The namespace of node `name`.
pub(crate) fn namespace(name: &str) -> String {
    format!("silt-{name}")
}

/// The nodes' namespaces and links, and the packets dropped between them now.
pub(crate) struct Net {
    /// Node name -> its address.
    nodes: BTreeMap<String, Ipv4Addr>,
    /// Node -> the nodes its packets to are dropped, with how many faults drop them (two
    /// faults at once may both).
    dropped: BTreeMap<String, BTreeMap<String, u32>>,
}

impl Net {
    /// Creates a namespace and a link for each of `nodes` (numbered from 10.77.0.11), after
    /// removing what an earlier run left.
    pub(crate) fn create(nodes: &[&str]) -> anyhow::Result<Net> {
        for program in ["ip", "nft"] {
            if Command::new(program).arg("-V").output().is_err() {
                bail!("`{program}` is not installed: silt-faults needs iproute2 and nftables (apt-get install iproute2 nftables)");
            }
        }
        let mut net = Net { nodes: BTreeMap::new(), dropped: BTreeMap::new() };
        for (i, name) in nodes.iter().enumerate() {
            net.nodes.insert(name.to_string(), Ipv4Addr::new(10, 77, 0, 11 + i as u8));
        }
        net.destroy();
        run("ip", &["link", "add", BRIDGE, "type", "bridge"])
            .context("creating a bridge (silt-faults must run as root)")?;
        run("ip", &["addr", "add", &format!("{HARNESS_IP}/24"), "dev", BRIDGE])?;
        run("ip", &["link", "set", BRIDGE, "up"])?;
        for (name, ip) in &net.nodes {
            let ns = namespace(name);
            let host_end = format!("sf-{name}");
            run("ip", &["netns", "add", &ns])?;
            run("ip", &["link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            run("ip", &["link", "set", &host_end, "master", BRIDGE, "up"])?;
            run("ip", &["-n", &ns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
            run("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
            run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
            net.apply(name)?;
        }
        Ok(net)
    }

    /// The address of node `name`.
    pub(crate) fn ip(&self, name: &str) -> Ipv4Addr {
        self.nodes[name]
    }

    /// Drops the packets node `from` sends to node `to` (what `to` sends still arrives, but a
    /// TCP connection either way needs both).
    pub(crate) fn drop_packets(&mut self, from: &str, to: &str) -> anyhow::Result<()> {
        *self.dropped.entry(from.to_string()).or_default().entry(to.to_string()).or_default() += 1;
        self.apply(from)
    }

    /// Undoes one [`Net::drop_packets`]: the packets pass again once no fault drops them.
    pub(crate) fn pass_packets(&mut self, from: &str, to: &str) -> anyhow::Result<()> {
        if let Some(count) = self.dropped.get_mut(from).and_then(|d| d.get_mut(to)) {
            *count = count.saturating_sub(1);
        }
        self.apply(from)
    }

    /// Lets every packet through.
    pub(crate) fn heal(&mut self) -> anyhow::Result<()> {
        self.dropped.clear();
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        for name in names {
            self.apply(&name)?;
        }
        Ok(())
    }

    /// Replaces node `name`'s rules with what `dropped` says, in one nftables transaction.
    fn apply(&self, name: &str) -> anyhow::Result<()> {
        let to: Vec<String> = self
            .dropped
            .get(name)
            .into_iter()
            .flatten()
            .filter(|(_, count)| **count > 0)
            .map(|(n, _)| self.nodes[n].to_string())
            .collect();
        let mut rules = String::from("table inet silt_faults {}\ndelete table inet silt_faults\n");
        rules.push_str("table inet silt_faults {\n  chain out {\n    type filter hook output priority 0; policy accept;\n");
        if !to.is_empty() {
            rules.push_str(&format!("    ip daddr {{ {} }} drop\n", to.join(", ")));
        }
        rules.push_str("  }\n}\n");
        let mut child = Command::new("ip")
            .args(["netns", "exec", &namespace(name), "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running nft")?;
        child.stdin.take().context("nft's stdin")?.write_all(rules.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("nft in {name}'s namespace failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }

    /// Removes every namespace, link and the bridge (what is already gone is skipped).
    pub(crate) fn destroy(&self) {
        for name in self.nodes.keys() {
            let _ = run("ip", &["netns", "del", &namespace(name)]);
            let _ = run("ip", &["link", "del", &format!("sf-{name}")]);
        }
        let _ = run("ip", &["link", "del", BRIDGE]);
    }
}
