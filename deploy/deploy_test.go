// The deployment files held against what reads them, as far as that can
// be done on one machine with no systemd to start them, no apiserver and
// no network: every Kubernetes manifest decoded strictly with k8s.io/api's
// types; every kilnd command line (the systemd unit's, the DaemonSet's)
// parsed by kilnd's own flag set; every NATS configuration read by
// nats-server's own parser and given to a server to validate; the NATS
// chart's values held to the chart's keys; and the names that tie them
// together (ports, paths, Secrets, Services, hosts) checked to agree.
package deploy_test

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/daemon"
)

// natsToken stands for the token in the tests: hex, as `openssl rand -hex
// 32` makes it, and starting with digits, which NATS's configuration
// parser must still read as a string when it takes it from the
// environment.
const natsToken = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// ---------------------------------------------------------------------
// kilnd's flags

// kilndFlag is one flag of kilnd, as its -h tells it.
type kilndFlag struct {
	value      bool // takes a value (not a boolean)
	repeatable bool // its help says it may be given more than once
}

var kilnd struct {
	once  sync.Once
	bin   string
	flags map[string]kilndFlag
	err   error
}

// kilndFlags builds kilnd once and reads its flags from `kilnd -h`: each
// flag's line is "  -NAME" and, for one that takes a value, " TYPE"
// (Go's flag.PrintDefaults), and its help follows on lines indented
// further. (kilnd's flag set is made in cmd/kilnd's daemonMain, which no
// other package can import; -h is that flag set as the binary has it. A
// boolean flag whose help names its value in backquotes would be read
// as one that takes a value: kilnd has none, and TestKilndFlagsAreRead
// holds the reading to flags of each kind.)
func kilndFlags(t *testing.T) (string, map[string]kilndFlag) {
	t.Helper()
	kilnd.once.Do(func() {
		dir, err := os.MkdirTemp("", "deploy-kilnd-")
		if err != nil {
			kilnd.err = err
			return
		}
		kilnd.bin = filepath.Join(dir, "kilnd")
		build := exec.Command("go", "build", "-o", kilnd.bin, "github.com/sandkiln/sandkiln/cmd/kilnd")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			kilnd.err = fmt.Errorf("build kilnd: %v: %s", err, out)
			return
		}
		out, err := runKilnd(kilnd.bin, "-h")
		if err != nil {
			kilnd.err = fmt.Errorf("kilnd -h: %v: %s", err, out)
			return
		}
		kilnd.flags = parseUsage(out)
		if len(kilnd.flags) == 0 {
			kilnd.err = fmt.Errorf("kilnd -h lists no flags: %s", out)
		}
	})
	if kilnd.err != nil {
		t.Fatal(kilnd.err)
	}
	return kilnd.bin, kilnd.flags
}

func TestMain(m *testing.M) {
	code := m.Run()
	if kilnd.bin != "" {
		os.RemoveAll(filepath.Dir(kilnd.bin))
	}
	os.Exit(code)
}

// runKilnd runs kilnd with args and an environment of PATH alone, so
// that no variable of the test's makes it another of its binary's roles
// or changes a default.
func runKilnd(bin string, args ...string) ([]byte, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	return cmd.CombinedOutput()
}

var usageLine = regexp.MustCompile(`^  -([^\s=]+)(?: (\S+))?(?:\t.*)?$`)

func parseUsage(out []byte) map[string]kilndFlag {
	flags := map[string]kilndFlag{}
	var last string
	for line := range strings.SplitSeq(string(out), "\n") {
		if m := usageLine.FindStringSubmatch(line); m != nil {
			last = m[1]
			flags[last] = kilndFlag{value: m[2] != ""}
			continue
		}
		if last != "" && strings.HasPrefix(line, "    ") && strings.Contains(line, "(repeatable") {
			f := flags[last]
			f.repeatable = true
			flags[last] = f
		}
	}
	return flags
}

// arg is one flag of a command line.
type arg struct{ name, value string }

// checkKilndArgs holds a kilnd command line's arguments to kilnd's flags
// (kilndArgs), failing the test with each problem, and returns the flags
// with their values.
func checkKilndArgs(t *testing.T, where string, args []string) []arg {
	t.Helper()
	parsed, problems := kilndArgs(t, args)
	for _, p := range problems {
		t.Errorf("%s: %s", where, p)
	}
	return parsed
}

// kilndArgs parses a kilnd command line's arguments against kilnd's
// flags, then has kilnd itself parse them: the arguments with -h after
// them, which kilnd answers with its usage and exit status 0 once every
// argument before it is one of its flags with a value its flag set
// accepts, and with status 2 otherwise. Nothing is started: -h ends
// kilnd before any of its work (and the first parse has made sure that
// no flag before it lacks its value, which -h would become). It returns
// the flags with their values, and what is wrong with them.
func kilndArgs(t *testing.T, args []string) (parsed []arg, problems []string) {
	t.Helper()
	bin, flags := kilndFlags(t)
	seen := map[string]bool{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			return parsed, append(problems, fmt.Sprintf("argument %q is not a flag: kilnd takes flags alone", a))
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		f, defined := flags[name]
		if !defined {
			problems = append(problems, fmt.Sprintf("kilnd has no flag --%s", name))
			continue
		}
		if f.value && !hasValue {
			if i+1 == len(args) {
				return parsed, append(problems, fmt.Sprintf("--%s needs a value", name))
			}
			i++
			value = args[i]
		}
		if seen[name] && !f.repeatable {
			problems = append(problems, fmt.Sprintf("--%s is given twice, and it is not repeatable (the last would win)", name))
		}
		seen[name] = true
		parsed = append(parsed, arg{name, value})
	}
	if len(problems) > 0 {
		return parsed, problems
	}
	if out, err := runKilnd(bin, append(slices.Clone(args), "-h")...); err != nil {
		first, _, _ := strings.Cut(string(out), "\n")
		problems = append(problems, fmt.Sprintf("kilnd refuses its arguments %q: %v: %s", args, err, first))
	}
	return parsed, append(problems, clusterValues(parsed)...)
}

// clusterValues holds the cluster flags' values to what kilnd's
// clusterConfig (cmd/kilnd) asks of them, which -h ends kilnd before:
// kilnd reads them as it starts, and refuses to start on a bad one.
// Without --cluster, kilnd refuses --node, --node-label and
// --cluster-routes and ignores the others: --advertise among them, and
// with it the host kilnd answers the other nodes at.
func clusterValues(args []arg) (problems []string) {
	has := map[string]bool{}
	embedded := false
	for _, a := range args {
		has[a.name] = true
		var err error
		switch a.name {
		case "cluster":
			if a.value == "embedded" {
				embedded = true
			} else {
				err = urlList(a.value, "nats", "tls")
			}
		case "cluster-routes":
			err = urlList(a.value, "nats-route")
		case "node":
			err = cluster.ValidateNode(a.value)
		case "node-label":
			if k, _, ok := strings.Cut(a.value, "="); !ok || k == "" {
				err = errors.New("want KEY=VALUE")
			}
		case "cluster-token-file", "cluster-nkey":
			if !filepath.IsAbs(a.value) {
				err = errors.New("want an absolute path")
			}
		case "cluster-listen", "cluster-route-listen":
			_, _, err = net.SplitHostPort(a.value)
		case "advertise":
			var u *url.URL
			if u, err = url.Parse(a.value); err == nil && (u.Scheme != "http" && u.Scheme != "https" || u.Port() == "" || u.Hostname() == "" || strings.Trim(u.Path, "/") != "") {
				err = errors.New("want http://HOST:PORT")
			}
		case "node-lost-after":
			var d time.Duration
			if d, err = time.ParseDuration(a.value); err == nil && (d < 10*time.Second || d > 24*time.Hour) {
				err = errors.New("want 10s to 24h")
			}
		}
		if err != nil {
			problems = append(problems, fmt.Sprintf("--%s %q: %v", a.name, a.value, err))
		}
	}
	if has["cluster-token-file"] && has["cluster-nkey"] {
		problems = append(problems, "--cluster-token-file and --cluster-nkey are each other's alternatives")
	}
	for _, f := range []string{"cluster-routes", "cluster-listen", "cluster-route-listen"} {
		if has[f] && !embedded {
			problems = append(problems, fmt.Sprintf("--%s is for --cluster embedded alone", f))
		}
	}
	// kilnd answers its advertised host itself: an --allow-host for it
	// is one to keep in step with --advertise for nothing.
	if u, err := url.Parse(lastOf(value(args, "advertise"))); has["cluster"] && err == nil && u.Host != "" {
		for _, h := range value(args, "allow-host") {
			if strings.EqualFold(h, u.Hostname()) || strings.EqualFold(h, u.Host) {
				problems = append(problems, fmt.Sprintf("--allow-host %s: kilnd answers its --advertise host, %s, without it", h, u.Host))
			}
		}
	}
	if !has["cluster"] {
		for _, f := range []string{"node", "node-label", "cluster-token-file", "cluster-nkey", "advertise", "node-lost-after"} {
			if has[f] {
				problems = append(problems, fmt.Sprintf("--%s is for a node of a cluster: without --cluster kilnd does not use it", f))
			}
		}
	}
	return problems
}

// urlList checks a comma-separated list of SCHEME://HOST:PORT, the
// scheme one of schemes.
func urlList(s string, schemes ...string) error {
	for u := range strings.SplitSeq(s, ",") {
		p, err := url.Parse(u)
		if err != nil {
			return err
		}
		if !slices.Contains(schemes, p.Scheme) || p.Hostname() == "" || p.Port() == "" || strings.Trim(p.Path, "/") != "" {
			return fmt.Errorf("%q: want %s://HOST:PORT", u, schemes[0])
		}
	}
	return nil
}

func value(args []arg, name string) []string {
	var out []string
	for _, a := range args {
		if a.name == name {
			out = append(out, a.value)
		}
	}
	return out
}

// TestKilndFlagsAreRead: the reading of `kilnd -h` finds flags that kilnd
// has, each as it is, so that the checks built on it are not vacuous.
func TestKilndFlagsAreRead(t *testing.T) {
	_, flags := kilndFlags(t)
	for name, want := range map[string]kilndFlag{
		"state-dir":  {value: true},
		"listen":     {value: true},
		"allow-host": {value: true, repeatable: true},
		"warm":       {value: true, repeatable: true},
		"runtimes":   {},
		// The cluster's, which the deployments here use.
		"cluster":            {value: true},
		"node":               {value: true},
		"node-label":         {value: true, repeatable: true},
		"cluster-token-file": {value: true},
		"advertise":          {value: true},
		"node-lost-after":    {value: true},
	} {
		if got, ok := flags[name]; !ok || got != want {
			t.Errorf("kilnd -h: --%s read as %+v (found: %v), want %+v", name, got, ok, want)
		}
	}

	// And the check finds what is wrong: kilnd's own parse included
	// (--warm's value is kilnd's to refuse).
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--state-dir=/x", "--no-such-flag=1"}, "no flag --no-such-flag"},
		{[]string{"--listen=:1", "--listen", ":2"}, "--listen is given twice"},
		{[]string{"--state-dir"}, "--state-dir needs a value"},
		{[]string{"--warm=nonsense=1"}, "kilnd refuses its arguments"},
		{[]string{"--cluster=http://a:4222"}, "want nats://HOST:PORT"},
		{[]string{"--cluster=nats://a:4222", "--cluster-routes=nats-route://b:6222"}, "for --cluster embedded alone"},
		{[]string{"--cluster=embedded", "--node=Node_A"}, "want a DNS name"},
		{[]string{"--cluster=embedded", "--node-lost-after=5s"}, "want 10s to 24h"},
		{[]string{"--advertise=http://a:7777"}, "without --cluster"},
		{[]string{"--state-dir", "/x", "stray"}, "not a flag"},
	} {
		_, problems := kilndArgs(t, tc.args)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
			t.Errorf("%q: problems %q, want one saying %q", tc.args, problems, tc.want)
		}
	}
	if _, problems := kilndArgs(t, []string{"--state-dir", "/x", "--allow-host=a", "--allow-host=b", "--cluster=tls://a:4222,nats://b:4222",
		"--node=node-a", "--node-label=zone=a", "--node-label=disk=ssd", "--advertise=http://10.1.2.3:7777", "--node-lost-after=2m"}); len(problems) > 0 {
		t.Errorf("a good command line: %q", problems)
	}

	// The hosts kilnd answers: its advertised one in a cluster alone.
	advertised := []string{"--listen=:7777", "--allow-host=kiln.example", "--advertise=http://10.1.2.3:7777"}
	inCluster := append([]string{"--cluster=embedded"}, advertised...)
	for _, tc := range []struct {
		args   []string
		host   string
		answer bool
	}{
		{inCluster, "10.1.2.3:7777", true},
		{inCluster, "10.1.2.3:8080", false},
		{advertised, "10.1.2.3:7777", false},
		{inCluster, "kiln.example:7777", true},
		{inCluster, "KILN.example.:443", true},
		{inCluster, "localhost:7777", true},
		{inCluster, "localhost:8080", false},
		{inCluster, "127.0.0.2:7777", true},
		{inCluster, "10.9.9.9:7777", false},
		{[]string{"--listen=10.9.9.9:7777"}, "10.9.9.9:7777", true},
	} {
		parsed, _ := kilndArgs(t, tc.args)
		if got := answers(parsed, tc.host); got != tc.answer {
			t.Errorf("%q: answers Host %s: %v, want %v", tc.args, tc.host, got, tc.answer)
		}
	}
	if _, problems := kilndArgs(t, append(inCluster, "--allow-host=10.1.2.3")); !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, "answers its --advertise host") }) {
		t.Errorf("an --allow-host for the advertised host: problems %q, want it said to be needless", problems)
	}

	// A flag kilnd does not define is refused by kilnd itself too, before
	// its -h: the check's second parse is no formality.
	bin, _ := kilndFlags(t)
	if out, err := runKilnd(bin, "--no-such-flag=1", "-h"); err == nil {
		t.Errorf("kilnd --no-such-flag=1 -h: exit status 0, want a refusal: %s", out)
	}
}

// ---------------------------------------------------------------------
// systemd

// unitFile is a systemd unit file: each section's keys and their values,
// in order.
type unitFile map[string]map[string][]string

func readUnit(t *testing.T, path string) unitFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unitFile{}
	var section string
	var logical strings.Builder
	lines := strings.Split(string(b), "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if logical.Len() == 0 && (line == "" || line[0] == '#' || line[0] == ';') {
			continue
		}
		// A backslash at a line's end joins the next line, as a space.
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			logical.WriteString(cont + " ")
			continue
		}
		logical.WriteString(line)
		line = logical.String()
		logical.Reset()
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || section == "" {
			t.Fatalf("%s:%d: %q is neither a section nor KEY=VALUE in one", path, i+1, line)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		u[section][k] = append(u[section][k], v)
	}
	if logical.Len() > 0 {
		t.Fatalf("%s: ends in a continued line", path)
	}
	return u
}

// one is the value of a key given once.
func (u unitFile) one(t *testing.T, section, key string) string {
	t.Helper()
	v := u[section][key]
	if len(v) != 1 {
		t.Fatalf("[%s] %s: given %d times, want once", section, key, len(v))
	}
	return v[0]
}

// readEnvFile reads an EnvironmentFile: KEY=VALUE lines, comments and
// blank lines, a value optionally quoted.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`).MatchString(k) {
			t.Fatalf("%s:%d: %q is not KEY=VALUE", path, i+1, line)
		}
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		env[k] = v
	}
	return env
}

// execArgs splits an Exec line as systemd does (systemd.service, "Command
// lines"): its prefix characters dropped, specifiers (%i, %%) replaced,
// words split at spaces with quotes and backslashes, ${NAME} replaced
// within its word and $NAME, a word of its own, replaced by its value's
// words. used collects the variables referred to.
func execArgs(t *testing.T, line, instance string, env map[string]string, used map[string]bool) []string {
	t.Helper()
	line = strings.TrimLeft(line, "@-:+!")
	var b strings.Builder
	for i := 0; i < len(line); i++ {
		if line[i] != '%' {
			b.WriteByte(line[i])
			continue
		}
		if i+1 == len(line) {
			t.Fatalf("exec line %q ends in %%", line)
		}
		i++
		switch line[i] {
		case '%':
			b.WriteByte('%')
		case 'i':
			if instance == "" {
				t.Fatalf("exec line %q uses %%i outside a template", line)
			}
			b.WriteString(instance)
		default:
			t.Fatalf("exec line %q: specifier %%%c: the test knows %%i and %%%% alone", line, line[i])
		}
	}
	lookup := func(name string) string {
		v, ok := env[name]
		if !ok {
			t.Errorf("exec line refers to $%s, which its EnvironmentFile does not set", name)
		}
		used[name] = true
		return v
	}
	var words []string
	var word strings.Builder
	inWord, quote := false, byte(0)
	bare := true // the word so far had no quote
	flush := func() {
		if !inWord {
			return
		}
		w := word.String()
		if m := regexp.MustCompile(`^\$([A-Za-z_][A-Za-z0-9_]*)$`).FindStringSubmatch(w); bare && m != nil {
			words = append(words, strings.Fields(lookup(m[1]))...)
		} else {
			words = append(words, regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`).ReplaceAllStringFunc(w, func(ref string) string {
				return lookup(ref[2 : len(ref)-1])
			}))
		}
		word.Reset()
		inWord, bare = false, true
	}
	s := b.String()
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote == 0 && (c == '"' || c == '\''):
			quote, inWord, bare = c, true, false
		case c == '\\' && i+1 < len(s):
			i++
			word.WriteByte(s[i])
			inWord = true
		case quote == 0 && (c == ' ' || c == '\t'):
			flush()
		default:
			word.WriteByte(c)
			inWord = true
		}
	}
	if quote != 0 {
		t.Fatalf("exec line %q: unclosed quote", line)
	}
	flush()
	return words
}

// TestSystemdKilnd: kilnd's unit runs kilnd with flags kilnd takes, its
// variables all set by the example environment file and all of those
// used, and keeps sandboxes running across kilnd's restarts.
func TestSystemdKilnd(t *testing.T) {
	u := readUnit(t, "systemd/kilnd.service")
	if got := u.one(t, "Service", "EnvironmentFile"); got != "/etc/sandkiln/kilnd.env" {
		t.Errorf("EnvironmentFile=%s, want /etc/sandkiln/kilnd.env (the example is systemd/kilnd.env)", got)
	}
	env := readEnvFile(t, "systemd/kilnd.env")
	used := map[string]bool{}
	argv := execArgs(t, u.one(t, "Service", "ExecStart"), "", env, used)
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !used[k] {
			t.Errorf("kilnd.env sets %s, which the unit does not use", k)
		}
	}
	if len(argv) == 0 || argv[0] != "/usr/local/bin/kilnd" {
		t.Fatalf("ExecStart runs %q, want /usr/local/bin/kilnd", argv)
	}
	args := checkKilndArgs(t, "kilnd.service", argv[1:])

	// What kilnd needs of systemd (docs/security.md): its cgroup
	// delegated, and its sandboxes left running when it stops.
	for key, want := range map[string]string{
		"Delegate":         "yes",
		"DelegateSubgroup": "kilnd", // the leaf kilnd runs in beside its sandboxes
		"KillMode":         "process",
	} {
		if got := u.one(t, "Service", key); got != want {
			t.Errorf("[Service] %s=%s, want %s", key, got, want)
		}
	}
	if got := u.one(t, "Install", "WantedBy"); got != "multi-user.target" {
		t.Errorf("WantedBy=%s", got)
	}

	// The listen port is the advertised one, and the advertised host is
	// one kilnd answers for: the other nodes, and the clients, come to it.
	_, port, err := net.SplitHostPort(lastOf(value(args, "listen")))
	if err != nil {
		t.Fatalf("--listen: %v", err)
	}
	for _, a := range value(args, "advertise") {
		p, _ := url.Parse(a)
		if p.Port() != port {
			t.Errorf("--advertise %s: port %s, but kilnd listens on %s", a, p.Port(), port)
		}
		if !answers(args, p.Host) {
			t.Errorf("--advertise %s: kilnd would refuse the Host %s", a, p.Host)
		}
	}
	if len(value(args, "cluster")) != 1 {
		t.Errorf("the unit gives --cluster %d times, want once", len(value(args, "cluster")))
	}
}

// answers reports whether kilnd, run with args, answers a TCP request
// whose Host is host, as kilnd's hostAllowed (internal/daemon) decides
// with the hosts cmd/kilnd gives it: a name or name:port of --allow-host,
// and in a cluster its --advertise URL's host with the port; else, with
// the listen port, localhost, a loopback address or the listen address.
func answers(args []arg, host string) bool {
	name, port, err := net.SplitHostPort(host)
	if err != nil {
		name, port = host, "80" // no port: the scheme's
	}
	name = strings.ToLower(strings.TrimSuffix(strings.Trim(name, "[]"), "."))
	for _, h := range allowedHosts(args) {
		if h = strings.ToLower(h); h == name || h == net.JoinHostPort(name, port) {
			return true
		}
	}
	listenHost, listenPort, err := net.SplitHostPort(cmp.Or(lastOf(value(args, "listen")), "127.0.0.1:7777"))
	if err != nil || port != listenPort {
		return false
	}
	ip, listenIP := net.ParseIP(name), net.ParseIP(listenHost)
	return name == "localhost" || ip != nil && (ip.IsLoopback() || listenIP != nil && !listenIP.IsUnspecified() && ip.Equal(listenIP))
}

// allowedHosts are the hosts kilnd adds to those of localhost and its
// listen address: --allow-host's, and in a cluster its --advertise URL's
// host (cmd/kilnd's daemonMain), with the port.
func allowedHosts(args []arg) []string {
	hosts := value(args, "allow-host")
	if len(value(args, "cluster")) > 0 {
		if u, err := url.Parse(lastOf(value(args, "advertise"))); err == nil && u.Host != "" {
			hosts = append(hosts, u.Host)
		}
	}
	return hosts
}

func lastOf(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}

// ---------------------------------------------------------------------
// NATS

// TestNATSServers: each of the three configurations is read by
// nats-server's own parser without an error or a warning, from the unit's
// own command line (nats-server's flag set), and makes a server
// (nats-server validates its options there: JetStream, cluster,
// authorization); the three are one cluster whose routes reach each
// other, and kilnd's --cluster names their client ports.
func TestNATSServers(t *testing.T) {
	t.Setenv("NATS_TOKEN", natsToken)
	u := readUnit(t, "systemd/nats-server@.service")
	if got := u.one(t, "Service", "EnvironmentFile"); got != "/etc/nats/nats.env" {
		t.Errorf("EnvironmentFile=%s, want /etc/nats/nats.env (where NATS_TOKEN is)", got)
	}
	if got := u.one(t, "Service", "KillSignal"); got != "SIGUSR2" {
		t.Errorf("KillSignal=%s, want SIGUSR2 (lame duck mode)", got)
	}
	stopTimeout, err := time.ParseDuration(u.one(t, "Service", "TimeoutStopSec") + "s")
	if err != nil {
		t.Fatalf("TimeoutStopSec: %v", err)
	}
	storeDir := "/var/lib/" + u.one(t, "Service", "StateDirectory")

	confs, _ := filepath.Glob("systemd/nats-*.conf")
	if len(confs) != 3 {
		t.Fatalf("%d NATS configurations %v, want 3", len(confs), confs)
	}
	names := map[string]bool{}
	var clusterName string
	var routes []string
	clientPort := 0
	for _, conf := range confs {
		instance := strings.TrimSuffix(filepath.Base(conf), ".conf")
		t.Run(instance, func(t *testing.T) {
			// Without an error or a warning (an unknown field is one).
			if _, err := server.ProcessConfigFile(conf); err != nil {
				t.Fatalf("nats-server reads %s: %v", conf, err)
			}
			// The unit's command line, with its configuration file here.
			argv := execArgs(t, u.one(t, "Service", "ExecStart"), instance, nil, map[string]bool{})
			if len(argv) == 0 || argv[0] != "/usr/local/bin/nats-server" {
				t.Fatalf("ExecStart runs %q, want /usr/local/bin/nats-server", argv)
			}
			args := slices.Clone(argv[1:])
			if i := slices.Index(args, "-c"); i < 0 || i+1 == len(args) || args[i+1] != "/etc/nats/"+instance+".conf" {
				t.Fatalf("nats-server@%s runs %q, want -c /etc/nats/%s.conf", instance, argv, instance)
			} else {
				args[i+1] = conf
			}
			fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			never := func() { t.Fatalf("nats-server %q would print its version or help", args) }
			opts, err := server.ConfigureOptions(fs, args, never, never, never)
			if err != nil || opts == nil {
				t.Fatalf("nats-server %q: %v", args, err)
			}
			opts.NoSigs, opts.NoLog = true, true
			s, err := server.NewServer(opts)
			if err != nil {
				t.Fatalf("nats-server %q: the options are refused: %v", args, err)
			}
			s.Shutdown()

			if opts.ServerName != instance {
				t.Errorf("server_name %q, want %q, its file's and unit instance's name", opts.ServerName, instance)
			}
			if names[opts.ServerName] {
				t.Errorf("server_name %q twice", opts.ServerName)
			}
			names[opts.ServerName] = true
			if !opts.JetStream || opts.StoreDir != storeDir {
				t.Errorf("jetstream %v in %q, want it on, in %s (the unit's StateDirectory)", opts.JetStream, opts.StoreDir, storeDir)
			}
			if opts.Authorization != natsToken {
				t.Errorf("authorization token %q, want $NATS_TOKEN's", opts.Authorization)
			}
			if opts.LameDuckDuration == 0 || opts.LameDuckDuration+opts.LameDuckGracePeriod >= stopTimeout {
				t.Errorf("lame duck %v (and %v grace) must end within the unit's TimeoutStopSec %v", opts.LameDuckDuration, opts.LameDuckGracePeriod, stopTimeout)
			}
			if opts.Cluster.Name == "" || opts.Cluster.Port == 0 {
				t.Errorf("cluster %q on port %d: want a named cluster with a route port", opts.Cluster.Name, opts.Cluster.Port)
			}
			var rs []string
			for _, r := range opts.Routes {
				if r.Scheme != "nats-route" || r.Port() != strconv.Itoa(opts.Cluster.Port) {
					t.Errorf("route %s: want nats-route://HOST:%d", r, opts.Cluster.Port)
				}
				rs = append(rs, r.Hostname())
			}
			slices.Sort(rs)
			if len(slices.Compact(slices.Clone(rs))) != 3 {
				t.Errorf("routes %v: want the three servers", rs)
			}
			if clusterName == "" {
				clusterName, routes, clientPort = opts.Cluster.Name, rs, opts.Port
			} else if opts.Cluster.Name != clusterName || !slices.Equal(rs, routes) || opts.Port != clientPort {
				t.Errorf("cluster %q, routes %v, client port %d; another server has %q, %v, %d", opts.Cluster.Name, rs, opts.Port, clusterName, routes, clientPort)
			}
			if !slices.ContainsFunc(rs, func(h string) bool { return strings.HasPrefix(h, instance+".") || h == instance }) {
				t.Errorf("routes %v: none names this server's host, %s", rs, instance)
			}
		})
	}

	// kilnd connects to the same three servers' client port.
	env := readEnvFile(t, "systemd/kilnd.env")
	var hosts []string
	for s := range strings.SplitSeq(env["KILND_CLUSTER"], ",") {
		p, err := url.Parse(s)
		if err != nil {
			t.Fatalf("KILND_CLUSTER: %v", err)
		}
		if p.Port() != strconv.Itoa(clientPort) {
			t.Errorf("KILND_CLUSTER %s: port %s, but the servers listen for clients on %d", s, p.Port(), clientPort)
		}
		hosts = append(hosts, p.Hostname())
	}
	slices.Sort(hosts)
	if !slices.Equal(hosts, routes) {
		t.Errorf("KILND_CLUSTER names %v, the NATS servers are %v", hosts, routes)
	}
}

// ---------------------------------------------------------------------
// Kubernetes

// manifests decodes every document of every file in kubernetes/ with
// k8s.io/api's types, strictly: an unknown or duplicated field, a kind
// the API does not have, a value of the wrong type each fail.
func manifests(t *testing.T) []runtime.Object {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	decoder := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	files, _ := filepath.Glob("kubernetes/*")
	if len(files) == 0 {
		t.Fatal("no manifests in kubernetes/")
	}
	var objs []runtime.Object
	for _, file := range files {
		if filepath.Ext(file) != ".yaml" {
			t.Errorf("%s: a manifest is a .yaml file", file)
			continue
		}
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		r := k8syaml.NewYAMLReader(bufio.NewReader(f))
		for n := 1; ; n++ {
			doc, err := r.Read()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: document %d: %v", file, n, err)
			}
			if onlyComments(doc) {
				continue
			}
			obj, gvk, err := decoder.Decode(doc, nil, nil)
			if err != nil {
				t.Errorf("%s: document %d (%v): %v", file, n, gvk, err)
				continue
			}
			objs = append(objs, obj)
		}
		f.Close()
	}
	return objs
}

func onlyComments(doc []byte) bool {
	for line := range strings.SplitSeq(string(doc), "\n") {
		if l := strings.TrimSpace(line); l != "" && l != "---" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// TestStrictDecodingRefuses: the decoding manifests uses does refuse an
// unknown field and a duplicated one, which a lenient one would drop.
func TestStrictDecodingRefuses(t *testing.T) {
	scheme := runtime.NewScheme()
	appsv1.AddToScheme(scheme)
	decoder := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	for _, doc := range []string{
		"apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: a}\nspec: {selectr: {}}\n",
		"apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: a, name: b}\n",
	} {
		if _, _, err := decoder.Decode([]byte(doc), nil, nil); !runtime.IsStrictDecodingError(err) {
			t.Errorf("%q decoded with %v, want a strict decoding error", doc, err)
		}
	}
}

// TestKubernetes: the manifests are a namespace that admits privileged
// pods, kilnd's DaemonSet in it with what kilnd needs, and a Service that
// reaches it; kilnd's command line is one kilnd takes; and what they name
// of each other and of NATS's chart (../helm/nats-values.yaml) agrees.
func TestKubernetes(t *testing.T) {
	var ns *corev1.Namespace
	var ds *appsv1.DaemonSet
	var svc *corev1.Service
	for _, obj := range manifests(t) {
		switch o := obj.(type) {
		case *corev1.Namespace:
			ns = o
		case *appsv1.DaemonSet:
			ds = o
		case *corev1.Service:
			svc = o
		default:
			t.Errorf("unexpected manifest %T", obj)
		}
	}
	if ns == nil || ds == nil || svc == nil {
		t.Fatalf("want a Namespace, a DaemonSet and a Service; have %v, %v, %v", ns != nil, ds != nil, svc != nil)
	}
	for _, m := range []metav1.ObjectMeta{ns.ObjectMeta, ds.ObjectMeta, svc.ObjectMeta} {
		for _, e := range validation.IsDNS1123Label(m.Name) {
			t.Errorf("name %q: %s", m.Name, e)
		}
	}
	if ds.Namespace != ns.Name || svc.Namespace != ns.Name {
		t.Errorf("DaemonSet in %q, Service in %q, want both in %q", ds.Namespace, svc.Namespace, ns.Name)
	}
	if got := ns.Labels["pod-security.kubernetes.io/enforce"]; got != "privileged" {
		t.Errorf("namespace %s: pod-security.kubernetes.io/enforce=%q, want privileged (kilnd's pods are)", ns.Name, got)
	}

	// The DaemonSet's selector selects its own pods, and so does the Service's.
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil || sel.Empty() {
		t.Fatalf("DaemonSet selector %v: %v", ds.Spec.Selector, err)
	}
	podLabels := labels.Set(ds.Spec.Template.Labels)
	if !sel.Matches(podLabels) {
		t.Errorf("DaemonSet selector %v does not select its pods %v", sel, podLabels)
	}
	if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("Service selector %v does not select kilnd's pods %v", svc.Spec.Selector, podLabels)
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		t.Errorf("updateStrategy %q: a rollout would end every node's sandboxes; want OnDelete", ds.Spec.UpdateStrategy.Type)
	}

	pod := ds.Spec.Template.Spec
	if pod.HostPID || pod.HostNetwork || pod.HostIPC {
		t.Errorf("hostPID %v, hostNetwork %v, hostIPC %v: kilnd needs none", pod.HostPID, pod.HostNetwork, pod.HostIPC)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want kilnd alone", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.Image == "" {
		t.Error("kilnd's container has no image")
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("kilnd's container is not privileged: it makes namespaces, cgroups, mounts, loop devices and nftables tables")
	}
	if c.Resources.Limits != nil {
		t.Errorf("limits %v: the sandboxes' cgroups are inside the container's, and would share them", c.Resources.Limits)
	}

	// kilnd's command line, its $(VAR)s replaced as the kubelet does, by
	// the container's variables: those from the downward API by a value
	// of the form they have.
	if !slices.Equal(c.Command, []string{"/usr/local/bin/kilnd"}) {
		t.Errorf("command %q, want [/usr/local/bin/kilnd]", c.Command)
	}
	vars := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			vars[e.Name] = map[string]string{"spec.nodeName": "node-a", "status.podIP": "10.1.2.3"}[e.ValueFrom.FieldRef.FieldPath]
			if vars[e.Name] == "" {
				t.Errorf("env %s: the test knows no value for fieldPath %s", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		case e.ValueFrom == nil:
			vars[e.Name] = e.Value
		}
	}
	var argv []string
	for _, a := range c.Args {
		argv = append(argv, regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(a, func(ref string) string {
			v, ok := vars[ref[2:len(ref)-1]]
			if !ok {
				// The kubelet would leave it as it is, silently.
				t.Errorf("argument %q: %s is no variable of the container", a, ref)
			}
			return v
		}))
	}
	args := checkKilndArgs(t, "DaemonSet kilnd", argv)
	stateDir := lastOf(value(args, "state-dir"))
	if stateDir == "" {
		t.Fatal("kilnd's arguments give no --state-dir")
	}
	if lastOf(value(args, "node")) != "node-a" {
		t.Errorf("--node %q: want the node's name (spec.nodeName), which outlives the pod", value(args, "node"))
	}

	// The API port: the one kilnd listens on, named by the Service and the probe.
	_, port, err := net.SplitHostPort(lastOf(value(args, "listen")))
	if err != nil {
		t.Fatalf("--listen: %v", err)
	}
	var apiPort *corev1.ContainerPort
	for i, p := range c.Ports {
		if strconv.Itoa(int(p.ContainerPort)) == port {
			apiPort = &c.Ports[i]
		}
	}
	if apiPort == nil || apiPort.Name == "" {
		t.Fatalf("no named container port for kilnd's --listen port %s", port)
	}
	for _, a := range value(args, "advertise") {
		p, _ := url.Parse(a)
		if p.Port() != port || !answers(args, p.Host) {
			t.Errorf("--advertise %s: want port %s and a host kilnd answers for", a, port)
		}
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != apiPort.Name && svc.Spec.Ports[0].TargetPort.IntValue() != int(apiPort.ContainerPort) {
		t.Fatalf("Service ports %+v: want one, to the container's port %s", svc.Spec.Ports, apiPort.Name)
	}
	for _, suffix := range []string{".svc", ".svc.cluster.local"} {
		name := svc.Name + "." + svc.Namespace + suffix
		if host := net.JoinHostPort(name, strconv.Itoa(int(svc.Spec.Ports[0].Port))); !answers(args, host) {
			t.Errorf("kilnd would refuse a client's Host %s, the Service's: no --allow-host %s", host, name)
		}
	}

	// Ready on GET /readyz, 503 while kilnd's cluster is down: the
	// Service then sends clients to nodes that serve the whole cluster.
	// Alive on GET /healthz, 200 whenever kilnd serves: a restart ends the
	// container's sandboxes, and would not bring NATS back. Each with a
	// Host kilnd answers for: a probe comes to the pod's address.
	probes := []struct {
		name, path string
		probe      *corev1.Probe
		required   bool
	}{
		{"readinessProbe", "/readyz", c.ReadinessProbe, true},
		{"livenessProbe", "/healthz", c.LivenessProbe, true},
		{"startupProbe", "/healthz", c.StartupProbe, false},
	}
	for _, pr := range probes {
		probe := pr.probe
		if probe == nil && !pr.required {
			continue
		}
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != pr.path {
			got := "none"
			if probe != nil && probe.HTTPGet != nil {
				got = "GET " + probe.HTTPGet.Path
			} else if probe != nil {
				got = "not an HTTP GET"
			}
			t.Errorf("%s: %s, want GET %s", pr.name, got, pr.path)
			continue
		}
		if pp := probe.HTTPGet.Port; pp.String() != apiPort.Name && pp.IntValue() != int(apiPort.ContainerPort) {
			t.Errorf("%s on port %s, want kilnd's %s", pr.name, pp.String(), apiPort.Name)
		}
		host := ""
		for _, h := range probe.HTTPGet.HTTPHeaders {
			if strings.EqualFold(h.Name, "Host") {
				host = h.Value
			}
		}
		if _, p, err := net.SplitHostPort(host); err != nil || p != port || !answers(args, host) {
			t.Errorf("%s Host %q: want one kilnd answers, with its port %s (localhost:%s answers)", pr.name, host, port, port)
		}
	}
	// Liveness gives kilnd a minute: a kilnd restarted ends its sandboxes.
	if p := c.LivenessProbe; p != nil {
		period, failures, timeout := cmp.Or(p.PeriodSeconds, 10), cmp.Or(p.FailureThreshold, 3), cmp.Or(p.TimeoutSeconds, 1)
		if period*failures < 60 || timeout < 2 {
			t.Errorf("livenessProbe: %d failures %ds apart, each after %ds, restart kilnd: want a minute or more of no answer, 2s or more each", failures, period, timeout)
		}
	}

	// Volumes: each mount names one, each one is mounted; the state on
	// the host, the NATS token from a Secret.
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	mounted := map[string]bool{}
	mountAt := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		if _, ok := volumes[m.Name]; !ok {
			t.Errorf("volumeMount %s: no such volume", m.Name)
		}
		mounted[m.Name] = true
		mountAt[m.MountPath] = m
	}
	for name := range volumes {
		if !mounted[name] {
			t.Errorf("volume %s is not mounted", name)
		}
	}
	state, ok := mountAt[stateDir]
	if v := volumes[state.Name]; !ok || v.HostPath == nil || v.HostPath.Path != "/var/lib/sandkiln" || state.ReadOnly || state.SubPath != "" {
		t.Errorf("--state-dir %s: want the host's /var/lib/sandkiln mounted there, writable", stateDir)
	}
	// kilnd keeps the cluster's API token there, replacing the file by a
	// rename, which a mount over it would refuse.
	if _, ok := mountAt[filepath.Join(stateDir, daemon.ClusterTokenName)]; ok {
		t.Errorf("STATE_DIR/%s is mounted over: kilnd writes the cluster's API token there", daemon.ClusterTokenName)
	}
	dev, ok := mountAt["/dev"]
	if v := volumes[dev.Name]; !ok || v.HostPath == nil || v.HostPath.Path != "/dev" {
		t.Error("want the host's /dev at /dev: loop devices made after the container's start are there alone")
	}
	if strings.HasPrefix(c.TerminationMessagePath, "/dev/") || c.TerminationMessagePath == "" {
		t.Errorf("terminationMessagePath %q: under /dev it is a file on the host", c.TerminationMessagePath)
	}
	natsSecret := ""
	for _, f := range value(args, "cluster-token-file") {
		m, ok := mountAt[filepath.Dir(f)]
		if v := volumes[m.Name]; !ok || v.Secret == nil || !m.ReadOnly {
			t.Errorf("--cluster-token-file %s: want a Secret mounted read-only at %s", f, filepath.Dir(f))
			continue
		}
		natsSecret = volumes[m.Name].Secret.SecretName
		if key := filepath.Base(f); !secretHasKey(volumes[m.Name].Secret, key) {
			t.Errorf("--cluster-token-file %s: the Secret %s is not said to hold the key %s", f, natsSecret, key)
		}
	}

	// NATS: the chart's client Service for the release nats in this
	// namespace, and its servers reading the token from the same Secret.
	values := readValues(t)
	want := fmt.Sprintf("nats://%s.%s.svc:%d", helmRelease, ns.Name, values.clientPort)
	if got := value(args, "cluster"); !slices.Equal(got, []string{want}) {
		t.Errorf("--cluster %q, want %s: the Service of NATS's chart installed as %s in %s", got, want, helmRelease, ns.Name)
	}
	if values.tokenSecret != natsSecret {
		t.Errorf("the NATS servers read their token from the Secret %q, kilnd from %q", values.tokenSecret, natsSecret)
	}
}

// secretHasKey: a Secret volume without items holds every key of its
// Secret (which a manifest here does not hold); with items, only those.
func secretHasKey(s *corev1.SecretVolumeSource, key string) bool {
	if len(s.Items) == 0 {
		return true
	}
	return slices.ContainsFunc(s.Items, func(k corev1.KeyToPath) bool { return k.Path == key })
}

// ---------------------------------------------------------------------
// NATS's Helm chart

// helmRelease is the release name the README installs the chart as: the
// chart names its client Service after it.
const helmRelease = "nats"

// check is what a key of the chart's values may hold.
type check func(raw json.RawMessage) error

// keys are the keys of a map in the chart's values: each a check or the
// keys of the map under it.
type keys map[string]any

// strictInto checks a value decodes into T, strictly: no unknown or
// duplicated field, names in their case.
func strictInto[T any]() check {
	return func(raw json.RawMessage) error {
		var v T
		strict, err := sigsjson.UnmarshalStrict(raw, &v, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
		return errors.Join(append(strict, err)...)
	}
}

var (
	boolean   = strictInto[bool]()
	integer   = strictInto[int]()
	str       = strictInto[string]()
	object    = strictInto[map[string]any]()
	jsonPatch = strictInto[[]map[string]any]()
	quantity  = check(func(raw json.RawMessage) error {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return fmt.Errorf("want a size such as 10Gi: %w", err)
		}
		_, err := resource.ParseQuantity(s)
		return err
	})
	// env is a container's env in the chart's form: each variable's name
	// to a string or to the rest of an EnvVar.
	env = check(func(raw json.RawMessage) error {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return err
		}
		for name, v := range m {
			if json.Unmarshal(v, new(string)) == nil {
				continue
			}
			if err := withKey(v, "name", name, strictInto[corev1.EnvVar]()); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		return nil
	})
	// spread is podTemplate.topologySpreadConstraints: each topology key
	// to the rest of a TopologySpreadConstraint.
	spread = check(func(raw json.RawMessage) error {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return err
		}
		for key, v := range m {
			if err := withKey(v, "topologyKey", key, strictInto[corev1.TopologySpreadConstraint]()); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
		}
		return nil
	})
	image = keys{"repository": str, "tag": str, "pullPolicy": str, "registry": str, "digest": str, "fullImageName": str}
	tls   = keys{"enabled": boolean, "secretName": str, "dir": str, "cert": str, "key": str, "merge": object, "patch": jsonPatch}
	named = keys{"merge": object, "patch": jsonPatch, "name": str}
)

// withKey checks raw, a map, with key: value added, as the chart adds it.
func withKey(raw json.RawMessage, key, value string, c check) error {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	m[key] = value
	b, _ := json.Marshal(m)
	return c(b)
}

// chartValues are keys of the values of NATS's chart (nats-io/k8s,
// helm/charts/nats, version 2.14.2), read from its values.yaml and
// templates: the ones a deployment of kilnd's NATS may want, not all. A
// key of ours that is not here is either a mistake or one to add here
// after reading the chart. merge under a Kubernetes resource is that
// resource (or container, or pod), which the chart merges into what it
// renders; under config, NATS configuration, checked by
// TestNATSChartConfig.
var chartValues = keys{
	"global":            keys{"image": keys{"pullPolicy": str, "pullSecretNames": strictInto[[]string](), "registry": str}, "labels": strictInto[map[string]string]()},
	"nameOverride":      str,
	"fullnameOverride":  str,
	"namespaceOverride": str,
	"config": keys{
		"cluster": keys{
			"enabled": boolean, "port": integer, "replicas": integer, "noAdvertise": boolean,
			"routeURLs": keys{"user": str, "password": str, "useFQDN": boolean, "k8sClusterDomain": str},
			"tls":       tls, "merge": object, "patch": jsonPatch,
		},
		"jetstream": keys{
			"enabled": boolean,
			"fileStore": keys{
				"enabled": boolean, "dir": str, "maxSize": quantity,
				"pvc": keys{"enabled": boolean, "size": quantity, "storageClassName": str, "name": str,
					"merge": strictInto[corev1.PersistentVolumeClaim](), "patch": jsonPatch},
			},
			"memoryStore": keys{"enabled": boolean, "maxSize": quantity},
			"merge":       object, "patch": jsonPatch,
		},
		"nats":             keys{"port": integer, "tls": tls},
		"monitor":          keys{"enabled": boolean, "port": integer, "tls": keys{"enabled": boolean}},
		"serverNamePrefix": str,
		"merge":            object,
		"patch":            jsonPatch,
	},
	"container": keys{
		"image": image, "env": env, "resources": strictInto[corev1.ResourceRequirements](),
		"merge": strictInto[corev1.Container](), "patch": jsonPatch,
	},
	"reloader":     keys{"enabled": boolean, "image": image, "env": env, "merge": strictInto[corev1.Container](), "patch": jsonPatch},
	"promExporter": keys{"enabled": boolean, "image": image, "port": integer, "env": env, "merge": strictInto[corev1.Container](), "patch": jsonPatch},
	"service": keys{"enabled": boolean, "name": str,
		"merge": strictInto[corev1.Service](), "patch": jsonPatch},
	"statefulSet": keys{"name": str, "merge": strictInto[appsv1.StatefulSet](), "patch": jsonPatch},
	"podTemplate": keys{
		"configChecksumAnnotation": boolean, "topologySpreadConstraints": spread,
		"merge": strictInto[corev1.Pod](), "patch": jsonPatch,
	},
	"headlessService":     keys{"name": str, "merge": strictInto[corev1.Service](), "patch": jsonPatch},
	"configMap":           named,
	"podDisruptionBudget": keys{"enabled": boolean, "name": str, "merge": object, "patch": jsonPatch},
	"serviceAccount":      keys{"enabled": boolean, "name": str, "merge": strictInto[corev1.ServiceAccount](), "patch": jsonPatch},
	"natsBox":             keys{"enabled": boolean},
}

// checkKeys walks our values beside the chart's keys.
func checkKeys(t *testing.T, path string, raw json.RawMessage, want any) {
	t.Helper()
	switch w := want.(type) {
	case check:
		if err := w(raw); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	case keys:
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Errorf("%s: want a map: %v", path, err)
			return
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			sub, ok := w[k]
			if !ok {
				t.Errorf("%s: the chart has no key %q here (see chartValues)", strings.TrimPrefix(path+"."+k, "."), k)
				continue
			}
			checkKeys(t, strings.TrimPrefix(path+"."+k, "."), m[k], sub)
		}
	default:
		t.Fatalf("%s: chartValues holds %T", path, want)
	}
}

// chart is what the test reads of our values.
type chart struct {
	raw         json.RawMessage
	v           values
	clientPort  int
	tokenSecret string // the Secret $NATS_TOKEN comes from
}

type values struct {
	Config struct {
		Cluster struct {
			Enabled  bool
			Replicas *int
			Port     *int
		}
		Jetstream struct {
			Enabled   bool
			FileStore struct {
				Enabled *bool
				Dir     *string
				MaxSize *string `json:"maxSize"`
				PVC     struct {
					Enabled *bool
					Size    *string
				} `json:"pvc"`
			} `json:"fileStore"`
			MemoryStore struct{ Enabled bool } `json:"memoryStore"`
		}
		Nats struct{ Port *int }
		// Merge is NATS configuration the chart adds to the servers'.
		Merge map[string]any
	}
	Container struct {
		Env map[string]json.RawMessage
	}
}

func readValues(t *testing.T) chart {
	t.Helper()
	b, err := os.ReadFile("helm/nats-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := yaml.YAMLToJSONStrict(b)
	if err != nil {
		t.Fatalf("nats-values.yaml: %v", err)
	}
	c := chart{raw: raw, clientPort: 4222} // the chart's config.nats.port
	if err := json.Unmarshal(raw, &c.v); err != nil {
		t.Fatalf("nats-values.yaml: %v", err)
	}
	if p := c.v.Config.Nats.Port; p != nil {
		c.clientPort = *p
	}
	if v, ok := c.v.Container.Env["NATS_TOKEN"]; ok {
		var e corev1.EnvVar
		json.Unmarshal(v, &e)
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			c.tokenSecret = e.ValueFrom.SecretKeyRef.Name
		}
	}
	return c
}

// TestNATSChartValues: every key of our values is one of the chart's,
// with a value of its form (a Kubernetes resource's strictly decoded);
// and they ask for what kilnd's cluster needs: 3 servers in one cluster,
// JetStream on files on a volume each, one per node, and the token from
// a Secret.
func TestNATSChartValues(t *testing.T) {
	c := readValues(t)
	checkKeys(t, "", c.raw, chartValues)

	v := c.v.Config
	if !v.Cluster.Enabled || v.Cluster.Replicas == nil || *v.Cluster.Replicas != 3 {
		t.Errorf("config.cluster: enabled %v, replicas %v; want a cluster of 3", v.Cluster.Enabled, v.Cluster.Replicas)
	}
	js := v.Jetstream
	if !js.Enabled {
		t.Error("config.jetstream.enabled is not true")
	}
	// The chart's defaults are file storage on a PVC; ours must not turn them off.
	if fs := js.FileStore; fs.Enabled != nil && !*fs.Enabled || fs.PVC.Enabled != nil && !*fs.PVC.Enabled {
		t.Error("config.jetstream.fileStore: want files, on a PersistentVolumeClaim")
	}
	if js.MemoryStore.Enabled {
		t.Error("config.jetstream.memoryStore: kilnd's streams are on files")
	}
	var raw struct {
		PodTemplate struct {
			TopologySpreadConstraints map[string]corev1.TopologySpreadConstraint `json:"topologySpreadConstraints"`
		} `json:"podTemplate"`
	}
	json.Unmarshal(c.raw, &raw)
	if s, ok := raw.PodTemplate.TopologySpreadConstraints[corev1.LabelHostname]; !ok || s.MaxSkew != 1 || s.WhenUnsatisfiable != corev1.DoNotSchedule {
		t.Errorf("podTemplate.topologySpreadConstraints: want %s with maxSkew 1, DoNotSchedule: one server per node", corev1.LabelHostname)
	}
	if c.tokenSecret == "" {
		t.Error("container.env: want NATS_TOKEN from a Secret (secretKeyRef)")
	}
}

// TestNATSChartConfig: the NATS configuration our values decide, as the
// chart renders it (its files/config templates: the server's name from
// the pod, client and route ports, a route to each replica on the
// headless Service, JetStream's store on the PVC, then config.merge, its
// << >> unquoted), is read by nats-server without an error, and makes a
// server: the token comes from $NATS_TOKEN, which the container's env
// sets.
func TestNATSChartConfig(t *testing.T) {
	t.Setenv("NATS_TOKEN", natsToken)
	c := readValues(t)
	v := c.v.Config
	routePort, replicas := 6222, 3
	if v.Cluster.Port != nil {
		routePort = *v.Cluster.Port
	}
	if v.Cluster.Replicas != nil {
		replicas = *v.Cluster.Replicas
	}
	var routes []string
	for i := range replicas {
		routes = append(routes, fmt.Sprintf("nats://%s-%d.%s-headless:%d", helmRelease, i, helmRelease, routePort))
	}
	dir, size := "/data", "10Gi"
	if p := v.Jetstream.FileStore.Dir; p != nil {
		dir = *p
	}
	if s := v.Jetstream.FileStore.PVC.Size; s != nil {
		size = *s
	}
	if s := v.Jetstream.FileStore.MaxSize; s != nil {
		size = *s
	}
	conf := map[string]any{
		"server_name": helmRelease + "-0",
		"port":        c.clientPort,
		"http_port":   8222,
		"cluster":     map[string]any{"name": helmRelease, "port": routePort, "no_advertise": true, "routes": routes},
		"jetstream":   map[string]any{"store_dir": dir, "max_file_store": "<< " + size + " >>", "max_memory_store": 0},
	}
	mergeInto(conf, v.Merge)
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // << >> as they are
	enc.SetIndent("", "  ")
	if err := enc.Encode(conf); err != nil {
		t.Fatal(err)
	}
	text := regexp.MustCompile(`"<< (.*?) >>"`).ReplaceAll(b.Bytes(), []byte("$1"))
	file := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(file, text, 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("nats-server reads the chart's configuration with our values: %v\n%s", err, text)
	}
	opts.NoSigs, opts.NoLog = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("the options are refused: %v\n%s", err, text)
	}
	s.Shutdown()
	if !opts.JetStream || len(opts.Routes) != 3 {
		t.Errorf("jetstream %v, %d routes; want JetStream and 3 routes", opts.JetStream, len(opts.Routes))
	}
	if opts.Authorization != natsToken {
		t.Errorf("authorization token %q, want $NATS_TOKEN's (config.merge.authorization.token)", opts.Authorization)
	}
	for _, ref := range regexp.MustCompile(`\$([A-Za-z_][A-Za-z0-9_]*)`).FindAllSubmatch(text, -1) {
		if _, ok := c.v.Container.Env[string(ref[1])]; !ok {
			t.Errorf("the configuration refers to $%s, which container.env does not set", ref[1])
		}
	}
}

// mergeInto merges src into dst as Helm's merge does where it matters
// here: maps merged key by key, anything else replaced.
func mergeInto(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				mergeInto(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}
