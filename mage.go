//go:build ignore

// Zero-install entry point: `go run mage.go <target>` works without a mage
// binary on PATH. It runs mage from magefiles/, whose go.mod holds kiln and
// its BuildKit and containerd graph, so the product's go.mod never lists
// them; the targets still run in this directory. (Run from the root, mage
// would resolve the magefile's imports against the root go.mod.)
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

// startedEnv names a file the targets remove when they start (targets'
// init): until then mage is compiling them, silently, for a minute on a
// fresh machine, so this process says so.
const startedEnv = "KILN_MAGE_STARTED"

// goflagsEnv carries the user's GOFLAGS past mage: mage lists each
// //mage:import package twice with go list, which loads BuildKit's and
// containerd's whole import graph every time (0.1 s a call, most of a
// no-op's time), so mage runs with -find added, which names a package and
// its files, all mage reads (0.03 s). go applies a GOFLAGS flag only to
// the commands that know it, so no go build sees it; the targets put the
// user's GOFLAGS back as they start. "unset" or "=" and the value.
const goflagsEnv = "KILN_MAGE_GOFLAGS"

// stampEnv and fingerprintEnv tell the targets where to record, once they
// start, that their binary was built from the inputs fingerprinted before
// mage ran (targets/started.go writes the record).
const (
	stampEnv       = "KILN_MAGE_STAMP"
	fingerprintEnv = "KILN_MAGE_FINGERPRINT"
)

func main() {
	// Mage's own check of the targets is a go list and a go build over
	// BuildKit's and containerd's graph: over a second on every run, most
	// of a no-op. When nothing the targets are built from changed since
	// they last started, their binary runs straight away, as mage would
	// run it; anything else (a mage flag, a changed file, go version or
	// environment) goes through mage.
	stamp, fingerprint := stampPath(), inputsFingerprint()
	if len(os.Args) > 1 && !strings.HasPrefix(os.Args[1], "-") && stamp != "" && fingerprint != "" {
		if exe, ok := upToDate(stamp, fingerprint); ok {
			debugf("nothing the targets are built from changed: running %s without mage", exe)
			runTargets(exe)
		}
	}
	debugf("running mage (stamp %q, fingerprint %q)", stamp, fingerprint)
	args := append([]string{"tool", "-C", "magefiles", "mage", "-d", ".", "-w", ".."}, os.Args[1:]...)
	cmd := exec.Command("go", args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = os.Environ()
	if stamp != "" && fingerprint != "" {
		cmd.Env = append(cmd.Env, stampEnv+"="+stamp, fingerprintEnv+"="+fingerprint)
	}
	done := make(chan struct{})
	var marker string
	if f, err := os.CreateTemp("", "kiln-mage-"); err == nil {
		f.Close()
		marker = f.Name()
		cmd.Env = append(cmd.Env, startedEnv+"="+marker)
		go sayCompiling(marker, done)
	}
	goflags, set := os.LookupEnv("GOFLAGS")
	saved := "unset"
	if set {
		saved = "=" + goflags
	}
	cmd.Env = append(cmd.Env, goflagsEnv+"="+saved, "GOFLAGS="+strings.TrimSpace(goflags+" -find"))
	// Ctrl-C reaches mage through the terminal's process group; mage
	// decides the exit code, this process only waits for it.
	signal.Ignore(os.Interrupt, syscall.SIGTERM)
	err := cmd.Run()
	close(done)
	if marker != "" {
		os.Remove(marker) // still there when mage failed before the targets ran
	}
	exit(err)
}

// exit leaves with the exit code of the command that ran.
func exit(err error) {
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		os.Exit(exit.ExitCode())
	case err != nil:
		fmt.Fprintln(os.Stderr, "mage.go:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// sayCompiling prints a line once the targets have not started for 3 s,
// then one every 20 s, until they start or mage ends.
func sayCompiling(marker string, done <-chan struct{}) {
	start := time.Now()
	next := 3 * time.Second
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		if _, err := os.Stat(marker); err != nil {
			return
		}
		if waited := time.Since(start); waited >= next {
			if next == 3*time.Second {
				fmt.Fprintln(os.Stderr, "kiln: compiling the mage targets (after kiln or the magefile changed; about a minute on a fresh machine)")
			} else {
				fmt.Fprintf(os.Stderr, "kiln: still compiling the mage targets (%s)\n", waited.Round(time.Second))
			}
			next += 20 * time.Second
		}
	}
}

// debugEnv, set to 1, makes this process say whether mage runs and why.
const debugEnv = "KILN_MAGE_DEBUG"

func debugf(format string, args ...any) {
	if os.Getenv(debugEnv) == "1" {
		fmt.Fprintf(os.Stderr, "mage.go: "+format+"\n", args...)
	}
}

// runTargets runs the targets binary mage built last, as mage runs it: in
// the repository root, with the arguments and environment mage would give.
func runTargets(exe string) {
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	gocmd := os.Getenv("MAGEFILE_GOCMD")
	if gocmd == "" {
		gocmd = "go"
	}
	cmd.Env = append(os.Environ(), "MAGEFILE_GOCMD="+gocmd)
	signal.Ignore(os.Interrupt, syscall.SIGTERM)
	exit(cmd.Run())
}

// targetsStamp is what the targets record when they start.
type targetsStamp struct {
	Fingerprint string
	Exe         string
	Size        int64
	ModTime     int64
}

// stampPath is this checkout's record in mage's cache folder, "" when there
// is none to use.
func stampPath() string {
	dir := os.Getenv("MAGEFILE_CACHE")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(home, ".magefile")
	}
	root, err := os.Getwd()
	if err != nil {
		return ""
	}
	sum := sha256.Sum256([]byte(root))
	return filepath.Join(dir, "kiln-targets-"+hex.EncodeToString(sum[:8])+".json")
}

// upToDate returns the targets binary the stamp names when the stamp was
// written for fingerprint and the binary is still the one mage built then.
func upToDate(stamp, fingerprint string) (string, bool) {
	data, err := os.ReadFile(stamp)
	if err != nil {
		return "", false
	}
	var st targetsStamp
	// Only a binary of mage's own cache folder, where the record lies.
	cache, err := filepath.EvalSymlinks(filepath.Dir(stamp))
	if err != nil || json.Unmarshal(data, &st) != nil || st.Fingerprint != fingerprint || filepath.Dir(st.Exe) != cache {
		return "", false
	}
	info, err := os.Stat(st.Exe)
	if err != nil || !info.Mode().IsRegular() || info.Size() != st.Size || info.ModTime().UnixNano() != st.ModTime {
		return "", false
	}
	return st.Exe, true
}

// inputsFingerprint digests what mage's build of the targets reads: the
// go version, the environment that steers go, and the name, size, times
// and mode of every file in magefiles/ and in the folders its go.mod replaces
// modules with (here, kiln itself). Modules from the module cache are
// named by go.mod and go.sum, which are among those files. "" when it
// cannot tell, or when a go.work could change the build.
func inputsFingerprint() string {
	h := sha256.New()
	fmt.Fprintf(h, "kiln mage.go 1\ngo %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		steers := strings.HasPrefix(name, "GO") || strings.HasPrefix(name, "CGO_") || strings.HasPrefix(name, "MAGEFILE_") ||
			name == "PATH" || name == "HOME" || name == "CC" || name == "CXX" || name == "PKG_CONFIG"
		return !steers
	})
	slices.Sort(env)
	for _, kv := range env {
		fmt.Fprintf(h, "env %s\n", kv)
	}
	magefiles, err := filepath.Abs("magefiles")
	if err != nil {
		return ""
	}
	for dir := magefiles; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return ""
		}
		if filepath.Dir(dir) == dir {
			break
		}
	}
	dirs, err := replacedDirs(magefiles)
	if err != nil {
		return ""
	}
	// A file changed within the clock tick of this walk could change again
	// unseen: nothing is vouched for until its times are 2 s old.
	start, latest := time.Now(), int64(0)
	for _, dir := range append([]string{magefiles}, dirs...) {
		fmt.Fprintf(h, "dir %s\n", dir)
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			name := d.Name()
			if d.IsDir() && path != dir && (name == ".git" || name == "_output") {
				return filepath.SkipDir
			}
			if name == "mage_output_file.go" { // mage writes it while it compiles
				return nil
			}
			if d.IsDir() { // its time changes with that file; its files say what changed
				fmt.Fprintf(h, "%q/\n", path)
				return nil
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			changed := changeTime(info)
			fmt.Fprintf(h, "%q %d %d %d %o\n", path, info.Size(), info.ModTime().UnixNano(), changed, info.Mode())
			latest = max(latest, info.ModTime().UnixNano(), changed)
			return nil
		})
		if err != nil {
			return ""
		}
	}
	if start.Sub(time.Unix(0, latest)) < 2*time.Second {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}

// changeTime is the file's status change time, 0 where the system gives
// none. Unlike its modification time, no program can set it back, so a
// rewrite that keeps size and time still shows. (Read by field name: the
// stat structure differs between systems.)
func changeTime(info fs.FileInfo) int64 {
	v := reflect.ValueOf(info.Sys())
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return 0
	}
	for _, name := range []string{"Ctim", "Ctimespec"} {
		if t := v.FieldByName(name); t.IsValid() && t.Kind() == reflect.Struct {
			sec, nsec := t.FieldByName("Sec"), t.FieldByName("Nsec")
			if sec.CanInt() && nsec.CanInt() {
				return sec.Int()*1e9 + nsec.Int()
			}
		}
	}
	return 0
}

// replacedDirs are the local folders that magefiles/go.mod replaces
// modules with, absolute.
func replacedDirs(magefiles string) ([]string, error) {
	f, err := os.Open(filepath.Join(magefiles, "go.mod"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var dirs []string
	inBlock := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "//")
		line = strings.TrimSpace(line)
		switch {
		case line == "replace (":
			inBlock = true
			continue
		case inBlock && line == ")":
			inBlock = false
			continue
		case strings.HasPrefix(line, "replace "):
			line = strings.TrimPrefix(line, "replace ")
		case !inBlock:
			continue
		}
		_, target, ok := strings.Cut(line, "=>")
		if !ok {
			continue
		}
		path := strings.Trim(strings.Fields(target + " x")[0], `"`)
		if strings.HasPrefix(path, "./") || strings.HasPrefix(path, "../") || filepath.IsAbs(path) || path == "." || path == ".." {
			if !filepath.IsAbs(path) {
				path = filepath.Join(magefiles, path)
			}
			dirs = append(dirs, filepath.Clean(path))
		}
	}
	return dirs, sc.Err()
}
