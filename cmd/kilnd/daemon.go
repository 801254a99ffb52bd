package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/docker/go-units"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/egress"
	"github.com/sandkiln/sandkiln/internal/mcp"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// Defaults: the state directory and the TCP address of the API.
const (
	defaultStateDir = "/var/lib/sandkiln"
	defaultListen   = "127.0.0.1:7777"
)

// sandboxEnv is the base environment of every sandboxed process.
var sandboxEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"LANG=C.UTF-8",
	"TERM=xterm-256color",
}

type repeated []string

func (o *repeated) String() string     { return strings.Join(*o, ",") }
func (o *repeated) Set(v string) error { *o = append(*o, v); return nil }

// daemonMain parses kilnd's flags and runs kilnd until a signal. It is
// long because it is a list: every flag with its help, in the order
// -help shows them, then each checked, with the error naming it, and made
// into the configuration, read top to bottom.
func daemonMain(args []string) int {
	fs := flag.NewFlagSet("kilnd", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: kilnd [flags]

kilnd runs sandboxes and serves their processes' API: on the unix socket
STATE_DIR/%s (mode 0600, no token) and on TCP (a bearer token, read from
STATE_DIR/%s, in "Authorization: Bearer TOKEN"). Sandboxes keep running
when kilnd stops; a restarted kilnd adopts them. It needs root.

Flags:
`, daemon.SocketName, daemon.TokenName)
		fs.PrintDefaults()
	}
	stateDir := fs.String("state-dir", envOr("KILN_STATE_DIR", defaultStateDir), "state `directory`: token, API socket, sandboxes and their captured logs (env KILN_STATE_DIR)")
	listen := fs.String("listen", defaultListen, "TCP `address` of the API; empty for the unix socket only")
	images := fs.String("images", "", "`directory` of root filesystems sandboxes may use (default STATE_DIR/images)")
	var allow repeated
	fs.Var(&allow, "allow-origin", "a browser `origin` allowed to call the API beside kilnd's own (repeatable)")
	var mounts repeated
	fs.Var(&mounts, "allow-mount", "a host `directory` whose directories, and itself, sandboxes may be given as mounts\n(-v SOURCE:TARGET), symbolic links resolved at kilnd's start and at each mount; without\none every mount is refused. A sandbox's processes read what the directory's others may\nread, and write where they may write; a mount not read-only lets them leave files there,\nowned by their host users (repeatable)")
	var hosts repeated
	fs.Var(&hosts, "allow-host", "a `name` (or name:port) TCP requests may carry as their Host beside localhost and the\nlisten address with its port, such as the machine's DNS name (repeatable)")
	previewDomain := fs.String("preview-domain", daemon.DefaultPreviewDomain, "the `domain` each preview URL gets a host of its own under, ID.DOMAIN: every name under it\nmust resolve to kilnd (a wildcard DNS record; localhost's do on their own), and is the\npreviews' alone")
	previewListen := fs.String("preview-listen", "", "a TCP `address` serving previews alone; empty: the API's listener serves them too, each on\nits own host")
	flowGrace := fs.Duration("flow-grace", 30*time.Second, "how long the output of a process started with flow block waits for the watcher holding it:\nto come after the start, and to come back after it went, or twice that to read on while it\nstays connected (1s to 1h); then it drops")
	defMemory := fs.String("default-memory", units.BytesSize(float64(daemon.DefaultLimits.MemoryBytes)), "the memory limit, a `size`, of a sandbox whose request gives none (0: none)")
	defPids := fs.Int64("default-pids", daemon.DefaultLimits.Pids, "the process limit of a sandbox whose request gives none (0: none)")
	defDisk := fs.String("default-disk", units.BytesSize(float64(daemon.DefaultLimits.DiskBytes)), "the disk quota, a `size`, of a sandbox whose request gives none: what it writes to /workspace and\nits image's writable layer, on a filesystem of its own (0: none)")
	defCPUs := fs.Float64("default-cpus", daemon.DefaultLimits.CPUs, "the CPU limit, in cores, of a sandbox whose request gives none (0: none)")
	runsc := fs.String("runsc", lookRunsc(), "gVisor's runsc `binary`, for sandboxes created with the runtime gvisor (default: runsc in PATH)")
	runscPlatform := fs.String("runsc-platform", "systrap", "how runsc intercepts a gVisor sandbox's system calls: systrap (gVisor's default) or ptrace")
	runtimes := fs.Bool("runtimes", false, "print the sandbox runtimes this host can run, and why the others cannot, and exit")
	instance := fs.String("instance", "", "this kilnd's `name` among those of the host (1 to 32 of a-z, 0-9 and -), which its nftables\ntable, its sandboxes' links and cgroups carry (default: the state directory's base name and a\nhash of its path, such as sandkiln-3fa2c1)")
	egressRange := fs.String("egress-range", "", "the IPv4 `CIDR` the addresses of sandboxes with a network come from, a /30 each; it must\nbe unused on the host, and is refused if another kilnd's overlaps it (default: the one this\nkilnd had, else the first of "+egress.DefaultRange.String()+" and the /16s after it no other kilnd has)")
	var egressDNS repeated
	fs.Var(&egressDNS, "egress-dns", "a name server (an IPv4 `address`) for sandboxes with a network (repeatable; default: the host's,\nfrom /etc/resolv.conf or, if that names only loopback ones, systemd-resolved's)")
	var insecure repeated
	fs.Var(&insecure, "insecure-registry", "a registry (`host[:port]`) images are pulled from over plain HTTP; those on loopback addresses\nalways are, every other one over TLS only (repeatable)")
	logMaxSize := fs.String("log-max-size", units.BytesSize(float64(daemon.DefaultLogs.MaxSizeBytes)), "the `size` at which a captured process's log file is rotated (64KiB to 1GiB), unless its\nsandbox's create request says otherwise")
	logMaxFiles := fs.Int("log-max-files", daemon.DefaultLogs.MaxFiles, "how many files of a captured process's log are kept, the active one included (2 to 100),\nunless its sandbox's create request says otherwise")
	warm := warmFlag(maps.Clone(daemon.DefaultWarm))
	fs.Var(warm, "warm", "[RUNTIME=]N: N sandboxes of the everyday shape (no name, hostname, image, init or\nnetwork; the default limits) kept made ahead for RUNTIME (namespaces unless given), so\nthat such a create takes one at once: 0 to 64 each, each costing an idle sandbox's memory\n(repeatable; gvisor: none unless asked)")
	snapQuota := fs.String("snapshot-quota", units.BytesSize(float64(daemon.DefaultSnapshotQuota)), "how much of the host's disk, a `size`, snapshots may take together (kiln snapshot); one past\nit is refused")
	keepDeleted := fs.Duration("keep-deleted", daemon.DefaultKeepDeleted, "how long a deleted sandbox's record and captured logs stay before they are removed (1s to\n8760h, a year)")
	captureBuffer := fs.String("capture-buffer", "8MiB", "per captured process, the `size` of output held for its log writer while it catches up\n(64KiB to 1GiB): a burst beyond it, faster than the disk, is dropped and counted")
	clusterURLs := fs.String("cluster", "", "join a cluster kept in NATS JetStream: its server `URLs`, comma-separated (nats://HOST:4222,…),\nor embedded to run a NATS server in this kilnd (its JetStream data in STATE_DIR/nats);\nwithout it, kilnd is a node of its own")
	nodeName := fs.String("node", "", "this kilnd's `name` in its cluster, unique there (default: the host's name)")
	var nodeLabels repeated
	fs.Var(&nodeLabels, "node-label", "a `KEY=VALUE` of this node, which a create's constraints match (repeatable)")
	clusterToken := fs.String("cluster-token-file", "", "a `file` whose first line is the token NATS asks of clients (and, embedded, of routes)")
	clusterNKey := fs.String("cluster-nkey", "", "a `file` holding the nkey seed this kilnd authenticates to NATS with")
	clusterRoutes := fs.String("cluster-routes", "", "with --cluster embedded: the other embedded servers' route `URLs`, comma-separated\n(nats-route://HOST:6222,…)")
	clusterListen := fs.String("cluster-listen", "127.0.0.1:4222", "with --cluster embedded: the `address` its NATS server takes clients on")
	clusterRouteListen := fs.String("cluster-route-listen", "0.0.0.0:6222", "with --cluster embedded: the `address` its NATS server takes the other servers' routes on\n(an address not loopback needs --cluster-token-file)")
	advertise := fs.String("advertise", "", "the `URL` the cluster's other nodes reach this kilnd's API at (default: http:// and --listen,\nthe host's name for an unspecified address)")
	nodeLostAfter := fs.Duration("node-lost-after", cluster.DefaultLostAfter, "how long a node of the cluster goes unheard before its sandboxes are node_lost (10s to 24h)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kilnd: unexpected arguments %q\n", fs.Args())
		return 2
	}
	queue, err := units.RAMInBytes(*captureBuffer)
	if err != nil || queue < 64<<10 || queue > 1<<30 {
		fmt.Fprintf(os.Stderr, "kilnd: --capture-buffer %q: want a size from 64KiB to 1GiB, such as 8MiB\n", *captureBuffer)
		return 2
	}
	logs := daemon.Logs{MaxFiles: *logMaxFiles}
	if logs.MaxSizeBytes, err = units.RAMInBytes(*logMaxSize); err != nil || logs.MaxSizeBytes == 0 || logs.MaxFiles == 0 || daemon.ValidateLogs(api.LogRotation(logs), "") != nil {
		fmt.Fprintf(os.Stderr, "kilnd: --log-max-size %q, --log-max-files %d: want a size from 64KiB to 1GiB, such as 10MiB, and 2 to 100 files\n", *logMaxSize, *logMaxFiles)
		return 2
	}
	if err := daemon.ValidatePreviewDomain(*previewDomain, hosts); err != nil {
		fmt.Fprintf(os.Stderr, "kilnd: --preview-domain, --allow-host: %v\n", err)
		return 2
	}
	if *flowGrace < time.Second || *flowGrace > time.Hour {
		fmt.Fprintf(os.Stderr, "kilnd: --flow-grace %v: want 1s to 1h\n", *flowGrace)
		return 2
	}
	if *keepDeleted < time.Second || *keepDeleted > 365*24*time.Hour {
		fmt.Fprintf(os.Stderr, "kilnd: --keep-deleted %v: want 1s to 8760h (a year), such as 24h\n", *keepDeleted)
		return 2
	}
	limits := api.Limits{Pids: *defPids, CPUs: *defCPUs}
	if *defMemory != "0" {
		if limits.MemoryBytes, err = units.RAMInBytes(*defMemory); err != nil {
			fmt.Fprintf(os.Stderr, "kilnd: --default-memory %q: want a size such as 1GiB, or 0 for none\n", *defMemory)
			return 2
		}
	}
	if *defDisk != "0" {
		if limits.DiskBytes, err = units.RAMInBytes(*defDisk); err != nil {
			fmt.Fprintf(os.Stderr, "kilnd: --default-disk %q: want a size such as 10GiB, or 0 for none\n", *defDisk)
			return 2
		}
	}
	snapshotQuota, err := units.RAMInBytes(*snapQuota)
	if err != nil || snapshotQuota <= 0 {
		fmt.Fprintf(os.Stderr, "kilnd: --snapshot-quota %q: want a size such as 100GiB\n", *snapQuota)
		return 2
	}
	if err := daemon.ValidateLimits(limits, ""); err != nil {
		fmt.Fprintf(os.Stderr, "kilnd: default limits: %v\n", err)
		return 2
	}
	var erange netip.Prefix
	if *egressRange != "" {
		erange, err = netip.ParsePrefix(*egressRange)
		if err != nil || !erange.Addr().Is4() || erange.Bits() > 29 {
			fmt.Fprintf(os.Stderr, "kilnd: --egress-range %q: want an IPv4 CIDR of /29 or wider, such as %s\n", *egressRange, egress.DefaultRange)
			return 2
		}
	}
	if *instance != "" {
		if err := daemon.ValidateInstance(*instance); err != nil {
			fmt.Fprintf(os.Stderr, "kilnd: --instance: %v\n", err)
			return 2
		}
	}
	var dns []netip.Addr
	for _, s := range egressDNS {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			fmt.Fprintf(os.Stderr, "kilnd: --egress-dns %q: want an IPv4 address\n", s)
			return 2
		}
		dns = append(dns, a)
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kilnd: find this binary:", err)
		return 1
	}
	cfg := daemon.Config{StateDir: *stateDir, Listen: *listen, AllowOrigins: allow, AllowHosts: hosts, PreviewDomain: *previewDomain, PreviewListen: *previewListen, Exe: exe, Env: sandboxEnv, Images: *images, AllowMounts: mounts,
		Runsc: *runsc, RunscPlatform: *runscPlatform, CaptureQueue: queue, Logs: logs, FlowGrace: *flowGrace, KeepDeleted: *keepDeleted, SnapshotQuota: snapshotQuota, Warm: warm, DefaultLimits: &limits,
		Instance: *instance, EgressRange: erange, EgressDNS: dns, InsecureRegistries: insecure}
	if *runtimes {
		return printRuntimes(cfg)
	}
	var ccfg *cluster.Config
	if *clusterURLs != "" {
		if ccfg, err = clusterConfig(*clusterURLs, *nodeName, nodeLabels, *clusterToken, *clusterNKey, *clusterRoutes, *clusterListen, *clusterRouteListen, *advertise, *listen, *stateDir, *nodeLostAfter); err != nil {
			fmt.Fprintln(os.Stderr, "kilnd:", err)
			return 2
		}
		if u, err := url.Parse(ccfg.APIURL); err == nil && u.Host != "" {
			cfg.AllowHosts = append(cfg.AllowHosts, u.Host)
		}
	} else if *nodeName != "" || len(nodeLabels) > 0 || *clusterRoutes != "" {
		fmt.Fprintln(os.Stderr, "kilnd: --node, --node-label and --cluster-routes need --cluster")
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg.Log = log
	cfg.Cluster = ccfg
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "kilnd: the namespace sandbox backend needs root (run it with sudo)")
		return 1
	}
	// /mcp serves the MCP server kiln mcp runs, calling back into this
	// kilnd on its own socket: one implementation, served both ways.
	mc, err := client.New(client.Options{Addr: "unix://" + filepath.Join(*stateDir, daemon.SocketName)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kilnd: the MCP server's client:", err)
		return 1
	}
	defer mc.Close()
	cfg.MCP = mcp.New(mc).Handler()
	d, err := daemon.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = d.Serve(ctx)
	// Its own goroutines, and what its runtimes share (runsc's empty
	// network namespace); the sandboxes run on, for the next kilnd.
	d.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	log.Info("kilnd stopped; its sandboxes run on")
	return 0
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// lookRunsc is runsc's path in PATH, or empty.
func lookRunsc() string {
	p, _ := exec.LookPath("runsc")
	return p
}

// printRuntimes serves --runtimes: each runtime, available or why not.
func printRuntimes(cfg daemon.Config) int {
	backends, unavailable := daemon.Backends(cfg)
	for i, name := range daemon.RuntimeNames {
		what := "available"
		if err := unavailable[name]; err != nil {
			what = "not available: " + err.Error()
		} else if g, ok := backends[name].(*sandbox.GVisor); ok {
			what = fmt.Sprintf("available: %s (%s), platform %s", g.Runsc, g.Version(), cfg.RunscPlatform)
		}
		if i == 0 {
			what += " (the default)"
		}
		fmt.Printf("%-11s %s\n", name, what)
	}
	return 0
}

// warmFlag is --warm: how many sandboxes are made ahead, by runtime.
type warmFlag map[string]int

func (w warmFlag) String() string {
	var parts []string
	for _, rt := range slices.Sorted(maps.Keys(w)) {
		parts = append(parts, fmt.Sprintf("%s=%d", rt, w[rt]))
	}
	return strings.Join(parts, ",")
}

func (w warmFlag) Set(v string) error {
	rt, count, ok := strings.Cut(v, "=")
	if !ok {
		rt, count = sandbox.RuntimeNamespaces, v
	}
	n, err := strconv.Atoi(count)
	if !slices.Contains(daemon.RuntimeNames, rt) || err != nil || n < 0 || n > daemon.MaxWarm {
		return fmt.Errorf("want [RUNTIME=]N, RUNTIME %s, N 0 to %d, such as gvisor=1", strings.Join(daemon.RuntimeNames, " or "), daemon.MaxWarm)
	}
	w[rt] = n
	return nil
}

// clusterConfig reads the cluster's flags.
func clusterConfig(urls, node string, labels []string, tokenFile, nkey, routes, listen, routeListen, advertise, apiListen, stateDir string, lostAfter time.Duration) (*cluster.Config, error) {
	c := &cluster.Config{Node: node, NKeyFile: nkey, LostAfter: lostAfter, Labels: map[string]string{}}
	if c.Node == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("--node: the host's name: %w", err)
		}
		c.Node = strings.ToLower(h)
	}
	if err := cluster.ValidateNode(c.Node); err != nil {
		return nil, fmt.Errorf("--node: %w", err)
	}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--node-label %q: want KEY=VALUE", l)
		}
		c.Labels[k] = v
	}
	if lostAfter < 10*time.Second || lostAfter > 24*time.Hour {
		return nil, fmt.Errorf("--node-lost-after %v: want 10s to 24h", lostAfter)
	}
	if tokenFile != "" {
		t, err := cluster.ReadTokenFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--cluster-token-file: %w", err)
		}
		c.Token = t
	}
	if urls == "embedded" {
		c.Embedded = &cluster.Embedded{StoreDir: filepath.Join(stateDir, "nats"), Listen: listen}
		if routes != "" {
			c.Embedded.RouteListen = routeListen
			c.Embedded.Routes = strings.Split(routes, ",")
		}
		// Whoever reaches an open port of the embedded server reads and
		// writes all the cluster keeps, its API token included.
		for flag, addr := range map[string]string{"--cluster-listen": listen, "--cluster-route-listen": c.Embedded.RouteListen} {
			if addr != "" && c.Token == "" && c.NKeyFile == "" && !loopback(addr) {
				return nil, fmt.Errorf("%s %s is not a loopback address: give --cluster-token-file, or anyone who reaches it joins the cluster and reads its API token", flag, addr)
			}
		}
	} else {
		if routes != "" {
			return nil, fmt.Errorf("--cluster-routes is for --cluster embedded; with NATS servers of their own, they route")
		}
		for u := range strings.SplitSeq(urls, ",") {
			p, err := url.Parse(u)
			if err != nil || p.Host == "" || p.Scheme != "nats" && p.Scheme != "tls" {
				return nil, fmt.Errorf("--cluster %q: want nats://HOST:PORT URLs, comma-separated, or embedded", u)
			}
			c.Servers = append(c.Servers, u)
		}
	}
	if advertise == "" {
		if apiListen == "" {
			return nil, fmt.Errorf("--cluster needs the API on TCP (--listen), for the other nodes")
		}
		host, port, err := net.SplitHostPort(apiListen)
		if err != nil {
			return nil, fmt.Errorf("--listen %q: %w", apiListen, err)
		}
		if ip, err := netip.ParseAddr(host); host == "" || err == nil && ip.IsUnspecified() {
			if host, err = os.Hostname(); err != nil {
				return nil, fmt.Errorf("--advertise: the host's name: %w", err)
			}
		}
		if port != "0" {
			advertise = "http://" + net.JoinHostPort(host, port)
		}
	}
	if advertise != "" {
		u, err := url.Parse(advertise)
		if err != nil || u.Host == "" || u.Scheme != "http" && u.Scheme != "https" || u.Path != "" && u.Path != "/" {
			return nil, fmt.Errorf("--advertise %q: want http://HOST:PORT or https://HOST:PORT", advertise)
		}
		c.APIURL = strings.TrimSuffix(advertise, "/")
	}
	return c, nil
}

// loopback says addr (HOST:PORT) listens on a loopback address alone.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback() || host == "localhost"
}
