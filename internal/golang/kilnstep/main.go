// Command kilnstep is what kiln's steps run besides the go command. kiln
// builds it inside BuildKit with the pinned toolchain. It moves Go build
// cache entries between the BuildKit cache mount kiln compiles with and a
// plain directory, and runs go build where the binaries it linked last time
// are kept:
//
//	kilnstep snapshot SPEC OUT  copies the entries the build's packages use
//	kilnstep seed SRC GOCACHE   adds a verified snapshot's entries
//	kilnstep gobuild KEEP OUT NAMES SIDE CPUS -- GO ARGS...
//	                            runs go build -o KEEP/ (it relinks only the
//	                            binaries whose inputs changed) and copies
//	                            NAMES (comma-separated NAME or NAME=PATH)
//	                            to OUT; SIDE go
//	                            builds run side by side, sharing the CPU
//	                            tokens in the directory CPUS ("-" alone)
//	kilnstep tool CPUS TOOL ARGS...
//	                            go build's -toolexec: runs one of go's
//	                            tools once it holds a CPU token of CPUS
//	kilnstep modules SRC DEST MODULES... -- GO ARGS...
//	                            copies the modules (path@version) from the
//	                            module cache SRC to DEST without their zips;
//	                            the go command downloads any SRC lacks
//
// It uses the standard library only, so that it compiles quickly.
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// progressEvery is how often a running go build says how far it got.
var progressEvery = 15 * time.Second

// reportProgress prints, every progressEvery until stop is closed, how many
// packages the go build has compiled: the action folders (b001, b002...)
// of its work folder under tmp, one for each package it compiles or binary
// it links, kept until go exits (a package found in GOCACHE makes none).
// After the first period it lists the build's packages once with list (go
// list -deps), in the background, to name the total; a build that ends
// sooner pays nothing for it.
func reportProgress(w io.Writer, tmp string, list []string, stop <-chan struct{}) {
	started := time.Now()
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	var total atomic.Int64
	last, lastTotal := -1, int64(0)
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if n == 0 && len(list) > 0 {
			go func() {
				cmd := exec.Command(list[0], list[1:]...)
				if out, err := cmd.Output(); err == nil {
					total.Store(int64(bytes.Count(out, []byte("\n"))))
				}
			}()
		}
		done, t := actionsRun(tmp), total.Load()
		if done == last && t == lastTotal {
			continue
		}
		last, lastTotal = done, t
		elapsed := time.Since(started).Round(time.Second)
		if t > 0 {
			fmt.Fprintf(w, "go build: %d/%d packages compiled (the rest from the cache), %s\n", done, t, elapsed)
		} else {
			fmt.Fprintf(w, "go build: %d packages compiled, %s\n", done, elapsed)
		}
	}
}

// actionsRun counts the action folders of go's work folders under tmp.
func actionsRun(tmp string) int {
	works, _ := filepath.Glob(filepath.Join(tmp, "go-build*"))
	var n int
	for _, work := range works {
		entries, _ := os.ReadDir(work)
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), "b") {
				n++
			}
		}
	}
	return n
}

// listArgs is the go list command that names every package the go build
// goArgs builds (GO build FLAGS... -o DIR PACKAGES...), with the flags
// that choose them; nil when goArgs has another shape.
func listArgs(goArgs []string) []string {
	o := slices.Index(goArgs, "-o")
	if len(goArgs) < 2 || goArgs[1] != "build" || o < 0 || o+2 > len(goArgs) {
		return nil
	}
	list := []string{goArgs[0], "list", "-deps"}
	for _, a := range goArgs[2:o] {
		if strings.HasPrefix(a, "-tags=") || strings.HasPrefix(a, "-mod=") {
			list = append(list, a)
		}
	}
	return append(list, goArgs[o+2:]...)
}

// Spec says which go commands find the entries to snapshot.
type Spec struct {
	GoCache string `json:"gocache"`
	// Max is the largest snapshot in bytes.
	Max  int64 `json:"max"`
	Runs []struct {
		Env  []string `json:"env"`
		Args []string `json:"args"`
	} `json:"runs"`
}

func main() {
	var err error
	switch {
	case len(os.Args) == 4 && os.Args[1] == "snapshot":
		err = snapshot(os.Args[2], os.Args[3])
	case len(os.Args) == 4 && os.Args[1] == "seed":
		err = seed(os.Args[2], os.Args[3])
	case len(os.Args) > 8 && os.Args[1] == "gobuild" && os.Args[7] == "--":
		var side int
		if side, err = strconv.Atoi(os.Args[5]); err == nil && side > 0 {
			names := slices.DeleteFunc(strings.Split(os.Args[4], ","), func(n string) bool { return n == "" }) // none: packages only
			err = gobuild(os.Args[2], os.Args[3], names, os.Args[8:], side, os.Args[6])
		} else {
			err = fmt.Errorf("gobuild: SIDE %q is not a positive number", os.Args[5])
		}
	case len(os.Args) > 3 && os.Args[1] == "tool":
		err = runTool(os.Args[2], os.Args[3:])
	case len(os.Args) > 5 && os.Args[1] == "modules" && slices.Contains(os.Args[4:], "--"):
		sep := 4 + slices.Index(os.Args[4:], "--")
		err = copyModules(os.Args[2], os.Args[3], os.Args[4:sep], os.Args[sep+1:])
	default:
		fmt.Fprintln(os.Stderr, "usage: kilnstep snapshot SPEC OUT | seed SRC GOCACHE | gobuild KEEP OUT NAMES SIDE CPUS -- GO ARGS... | tool CPUS TOOL ARGS... | modules SRC DEST MODULES... -- GO ARGS...")
		os.Exit(2)
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		os.Exit(exit.ExitCode()) // go printed why
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kilnstep:", err)
		os.Exit(1)
	}
}

// snapshot runs each go command with GODEBUG=gocachehash=1, which prints
// the action ID of every package it builds or finds cached, and copies the
// action entry (-a) and output entry (-d) of each.
func snapshot(specFile, out string) error {
	dt, err := os.ReadFile(specFile)
	if err != nil {
		return err
	}
	var spec Spec
	if err := json.Unmarshal(dt, &spec); err != nil {
		return err
	}
	ids := map[string]bool{}
	for _, run := range spec.Runs {
		var stderr bytes.Buffer
		cmd := exec.Command(run.Args[0], run.Args[1:]...)
		cmd.Env = append(run.Env, "GODEBUG=gocachehash=1")
		cmd.Stdout, cmd.Stderr = os.Stdout, &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s: %v\n%s", strings.Join(run.Args, " "), err, lastLines(stderr.String(), 20))
		}
		sc := bufio.NewScanner(&stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, "HASH[build ") {
				continue
			}
			if i := strings.LastIndex(line, "]: "); i > 0 && isID(line[i+3:]) {
				ids[line[i+3:]] = true
			}
		}
	}
	sorted := make([]string, 0, len(ids))
	for id := range ids {
		sorted = append(sorted, id)
	}
	sort.Strings(sorted)
	var total int64
	entries := 0
	for _, id := range sorted {
		action := filepath.Join(spec.GoCache, id[:2], id+"-a")
		dt, err := os.ReadFile(action)
		if err != nil {
			continue // not cached: nothing to carry
		}
		f := strings.Fields(string(dt))
		if len(f) < 3 || !isID(f[2]) {
			continue
		}
		output := filepath.Join(spec.GoCache, f[2][:2], f[2]+"-d")
		n, err := copyFile(output, filepath.Join(out, f[2][:2], f[2]+"-d"), nil)
		if err != nil {
			continue // an action without its output is of no use
		}
		if _, err := copyFile(action, filepath.Join(out, id[:2], id+"-a"), nil); err != nil {
			return err
		}
		total += n + int64(len(dt))
		entries++
		if spec.Max > 0 && total > spec.Max {
			return fmt.Errorf("the Go cache snapshot passed its cap of %d bytes after %d of %d entries; raise cache.gocacheMax in build/kiln.yaml", spec.Max, entries, len(sorted))
		}
	}
	fmt.Printf("snapshot: %d entries, %d bytes, of %d packages\n", entries, total, len(sorted))
	return nil
}

// seed copies the entries GOCACHE lacks; kiln verified them beforehand.
func seed(src, gocache string) error {
	added, present := 0, 0
	err := filepath.Walk(src, func(path string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		dest := filepath.Join(gocache, rel)
		if _, err := os.Stat(dest); err == nil {
			present++
			return nil
		}
		tmp := dest + ".seed"
		if _, err := copyFile(path, tmp, nil); err != nil {
			return err
		}
		added++
		return os.Rename(tmp, dest)
	})
	fmt.Printf("seed: %d entries added, %d already present\n", added, present)
	return err
}

func isID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// copyFile writes a fresh file (a current mtime keeps go's cache trimming
// from deleting it early) and returns its size. tee, when set, is given
// the bytes too.
func copyFile(src, dest string, tee io.Writer) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dest), 0o777); err != nil {
		return 0, err
	}
	out, err := os.OpenFile(dest, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o666)
	if err != nil {
		return 0, err
	}
	var w io.Writer = out
	if tee != nil {
		w = io.MultiWriter(out, tee)
	}
	n, err := io.Copy(w, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return n, err
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// keptFile is what gobuild recorded of a binary it left in KEEP.
type keptFile struct {
	Size    int64 `json:"size"`
	ModTime int64 `json:"modTime"`
	// BuildID is the binary's Go build ID note, and Linked when go linked
	// that build ID: go touches a binary it finds up to date, so the
	// modification time does not tell.
	BuildID string `json:"buildID,omitempty"`
	Linked  int64  `json:"linked,omitempty"`
	// Sum is the digest of the copy of a binary whose build ID gobuild
	// cannot read (not ELF): the same bytes keep the same Linked.
	Sum string `json:"sum,omitempty"`
}

const keptRecord = ".kilnstep-kept.json"

// goWork is the folder in KEEP where go works when it relinks binaries
// kept there; a build that was killed leaves it for the next to remove.
const goWork = ".gowork"

// lastRun is the file in KEEP that names the go command (goRun) of the
// last go build that succeeded there.
const lastRun = ".kilnstep-last-run"

// keepLockFile is the lock in KEEP that a go build holds from start to
// end. BuildKit lets one step at a time have the mount, but only within
// one daemon: the steps of a daemon that was killed run on beside the
// next one's, writing the same binaries.
const keepLockFile = ".kilnstep-lock"

// goRun names a go command: its arguments and the environment go reads.
// Another one (other flags, packages, toolchain settings) may compile
// every package again.
func goRun(goArgs []string) string {
	h := sha256.New()
	for _, a := range goArgs {
		fmt.Fprintf(h, "%q\n", a)
	}
	env := slices.Sorted(slices.Values(os.Environ()))
	for _, kv := range env {
		if (strings.HasPrefix(kv, "GO") || strings.HasPrefix(kv, "CGO_")) && !strings.HasPrefix(kv, "GOTMPDIR=") {
			fmt.Fprintf(h, "%q\n", kv)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// withParallelism lets a go build that runs beside side-1 others share the
// CPUs with them, so that together they run as many compiles and links at
// once as one go build would, and peak memory stays that of one: each runs
// go's tools through kilnstep tool, which waits for one of the CPU tokens in
// cpus. A go build that finishes first leaves its tokens to the others (an
// even split of -p would leave its CPUs idle). When GOFLAGS sets -toolexec,
// each gets -p of its share of the CPUs instead, unless GOFLAGS sets -p too.
// Both are decided here, in the step, so that the step's definition (its
// cache key) is the same on any machine; neither changes what go builds.
func withParallelism(goArgs []string, side int, cpus string) []string {
	if side <= 1 || len(goArgs) < 2 {
		return goArgs
	}
	flag := ""
	if cpus != "-" {
		self, err := os.Executable()
		if err == nil {
			flag = "-toolexec=" + self + " tool " + cpus
		}
	}
	if goflagsSet("toolexec") {
		flag = ""
	}
	if flag == "" {
		if goflagsSet("p") {
			return goArgs
		}
		flag = "-p=" + strconv.Itoa(max(1, (runtime.GOMAXPROCS(0)+side-1)/side)) // 3 CPUs: 2 and 2, none idle
	}
	return append(append(slices.Clone(goArgs[:2]), flag), goArgs[2:]...)
}

// goflagsSet says whether GOFLAGS sets the flag, split as go splits it:
// by spaces outside quotes, with one or two dashes.
func goflagsSet(name string) bool {
	var fields []string
	field, quote, in := "", byte(0), false
	for _, c := range []byte(os.Getenv("GOFLAGS")) {
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote != 0:
			field += string(c)
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if in {
				fields = append(fields, field)
			}
			field, in = "", false
		default:
			field, in = field+string(c), true
		}
	}
	if in {
		fields = append(fields, field)
	}
	for _, f := range fields {
		f = strings.TrimPrefix(strings.TrimPrefix(f, "-"), "-")
		if f == name || strings.HasPrefix(f, name+"=") {
			return true
		}
	}
	return false
}

// runTool runs one of go's tools (compile, asm, link) in place of this
// process once it holds a CPU token: the lock on one of GOMAXPROCS files in
// cpus, which it keeps across exec and the kernel drops when the tool
// exits, however it exits. A large compile first takes the one lock of
// largeGate, so two never run at once. go asking a tool for its version
// runs at once.
func runTool(cpus string, cmdline []string) error {
	tool := cmdline[0]
	if !strings.Contains(tool, "/") {
		path, err := exec.LookPath(tool)
		if err != nil {
			return err
		}
		tool = path
	}
	if !(len(cmdline) == 2 && cmdline[1] == "-V=full") {
		if strings.HasPrefix(filepath.Base(tool), "compile") && goSourceBytes(cmdline[1:]) >= largeCompile {
			if err := takeOne(cpus, []string{largeGate}, time.Now().Add(tokenWait)); err != nil {
				return err
			}
		}
		if err := takeCPU(cpus, time.Now().Add(tokenWait)); err != nil {
			return err
		}
	}
	if err := syscall.Exec(tool, cmdline, os.Environ()); err != nil {
		return fmt.Errorf("run %s: %w", cmdline[0], err)
	}
	return nil
}

// tokenWait is how long a tool waits for a CPU token before it runs
// without one: a token is held by one compile or link, which ends, unless
// another build on the daemon holds the locks and never lets go.
const tokenWait = 5 * time.Minute

// largeCompile is the Go source size, in bytes, of a package whose compile
// takes the large gate. A compile's memory grows with its package: on
// linux/amd64, runtime (2.7 MB of source) peaks at 297 MB, net/http
// (0.9 MB) at 205 MB, crypto/tls (0.46 MB) at 149 MB, and packages under
// 256 KiB at 105 MB at most. Two platforms' go builds side by side compile
// the same packages at about the same time; without the gate the two
// runtimes compiled together and a cold build's compiles peaked at 600 MB
// against one go build's 345 MB.
const largeCompile = 256 << 10

// largeGate is the lock file in the tokens' folder that large compiles take.
const largeGate = "large"

// coldGate is the lock file in the tokens' folder that a go build starting
// cold holds while it runs.
const coldGate = "cold"

// coldWait is how long a cold go build waits for its turn before it runs
// beside the other: longer than one platform's cold build of a large
// module (7 minutes for 2,000 packages on 2 cores).
const coldWait = time.Hour

// coldTurn waits until no other cold go build runs and holds coldGate
// until this process exits. Two platforms' go builds compiling from nothing
// side by side, sharing the CPU tokens, cost more than one after the other:
// BuildKit's buildkitd and buildctl for linux/amd64 and linux/arm64 with
// an empty GOCACHE took 689 CPU-s and 352 s side by side against 657 and
// 341 one after the other, on 2 cores. Edits, where one platform's build
// waits on a single compile or link, keep running side by side.
// It says whether it holds the gate: not when the wait ran out.
func coldTurn(cpus string, deadline time.Time) (bool, error) {
	fd, err := openLock(filepath.Join(cpus, coldGate))
	if err != nil {
		return false, err
	}
	if err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		return true, nil
	}
	fmt.Fprintln(os.Stderr, "go build: waiting for another platform's go build; cold builds take turns")
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	_, ok, err := waitFirst([]int{fd}, timeout.C)
	if !ok {
		return false, runWithout(cpus, []string{coldGate})
	}
	return err == nil, err
}

// goSourceBytes adds up the sizes of the .go files a compile is given. go
// writes a response file (@FILE) only for its own tools, never for a
// -toolexec program, so the files are all on the command line.
func goSourceBytes(args []string) int64 {
	var n int64
	for _, a := range args {
		if strings.HasSuffix(a, ".go") {
			if fi, err := os.Stat(a); err == nil {
				n += fi.Size()
			}
		}
	}
	return n
}

// takeCPU takes one of GOMAXPROCS CPU tokens in cpus.
func takeCPU(cpus string, deadline time.Time) error {
	names := make([]string, runtime.GOMAXPROCS(0))
	for i := range names {
		names[i] = strconv.Itoa(i)
	}
	return takeOne(cpus, names, deadline)
}

// takeOne locks one of the named files in dir and keeps that lock open, for
// the tool it execs, when it returns nil. A tool that finds none free waits
// in the kernel, never polling: where there are several tokens, first for
// their queue lock, so that one waiter at a time waits on the tokens
// themselves, then on every token at once, a thread each. The first lock
// it gets is the one it keeps: every other descriptor is closed, or is
// close-on-exec, so a token another thread got meanwhile comes back when
// the tool starts. Polling took 2% of a CPU for each waiter and left a
// freed token idle for up to the poll's interval.
func takeOne(dir string, names []string, deadline time.Time) error {
	n := len(names)
	fds := make([]int, n)
	for i, base := range names {
		fd, err := openLock(filepath.Join(dir, base))
		if err != nil {
			closeLocks(fds[:i])
			return err
		}
		fds[i] = fd
	}
	first := os.Getpid() % n // where waiting is not needed, spread over the tokens
	for k := range n {
		i := (first + k) % n
		switch err := syscall.Flock(fds[i], syscall.LOCK_EX|syscall.LOCK_NB); err {
		case nil:
			return keepLock(fds, i)
		case syscall.EWOULDBLOCK, syscall.EINTR:
		default:
			closeLocks(fds)
			return fmt.Errorf("lock %s: %w", filepath.Join(dir, names[i]), err)
		}
	}
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	if n > 1 {
		// One queue for each count of tokens: a waiter for the first two
		// must not keep one for the first four from the other two.
		queueName := filepath.Join(dir, fmt.Sprintf("%s-%d", tokenQueue, n))
		queue, err := openLock(queueName)
		if err != nil {
			closeLocks(fds)
			return err
		}
		defer syscall.Close(queue) // the next waiter's turn, once a token is held
		_, ok, err := waitFirst([]int{queue}, timeout.C)
		if !ok {
			return runWithout(dir, names)
		}
		if err != nil {
			closeLocks(fds)
			return fmt.Errorf("lock %s: %w", queueName, err)
		}
	}
	i, ok, err := waitFirst(fds, timeout.C)
	if !ok {
		return runWithout(dir, names)
	}
	if err != nil {
		return fmt.Errorf("lock %s: %w", filepath.Join(dir, names[i]), err)
	}
	return keepAcrossExec(fds[i])
}

// waitFirst waits in the kernel for the lock of any of fds, a thread each,
// and says which it got first; ok is false when timeout fires before.
func waitFirst(fds []int, timeout <-chan time.Time) (index int, ok bool, err error) {
	type result struct {
		index int
		err   error
	}
	got := make(chan result, len(fds))
	for i, fd := range fds {
		go func() { got <- result{i, waitLock(fd)} }()
	}
	select {
	case r := <-got:
		return r.index, true, r.err
	case <-timeout:
		return 0, false, nil
	}
}

// tokenQueue names the lock files in the tokens' folder that waiters for
// a CPU token take in turn (queue-N for N tokens).
const tokenQueue = "queue"

// openLock opens a lock file, close-on-exec. A lock needs no write access;
// a planted link is not followed, and only a regular file will do.
func openLock(name string) (int, error) {
	fd, err := syscall.Open(name, syscall.O_RDONLY|syscall.O_CREAT|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return -1, fmt.Errorf("lock %s: %w", name, err)
	}
	var st syscall.Stat_t
	if err = syscall.Fstat(fd, &st); err == nil && st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		err = errors.New("not a regular file")
	}
	if err != nil {
		syscall.Close(fd)
		return -1, fmt.Errorf("lock %s: %w", name, err)
	}
	return fd, nil
}

// waitLock takes the lock of fd, waiting for it in the kernel.
func waitLock(fd int) error {
	for {
		if err := syscall.Flock(fd, syscall.LOCK_EX); err != syscall.EINTR {
			return err
		}
	}
}

// keepLock keeps the lock of fds[held] across exec and closes the others.
func keepLock(fds []int, held int) error {
	for i, fd := range fds {
		if i != held {
			syscall.Close(fd)
		}
	}
	return keepAcrossExec(fds[held])
}

// keepAcrossExec clears the close-on-exec flag of a held lock.
func keepAcrossExec(fd int) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_SETFD, 0); errno != 0 {
		return fmt.Errorf("keep a lock across exec: %w", errno)
	}
	return nil
}

func closeLocks(fds []int) {
	for _, fd := range fds {
		syscall.Close(fd)
	}
}

// runWithout says that the tool runs without a lock: whoever holds them has
// kept them for longer than any compile or link takes.
func runWithout(dir string, names []string) error {
	fmt.Fprintf(os.Stderr, "kilnstep: no lock of %s in %s came free in time; running without one\n", strings.Join(names, ", "), dir)
	return nil
}

// gobuild runs the go command, whose -o is KEEP/, and copies the named
// binaries to OUT: NAME to OUT/NAME, or NAME=PATH to OUT/PATH (a binary's
// own output mount, laid out as it is exported). go skips the link of a
// binary in KEEP whose build ID says it was linked from the same inputs,
// so an edit relinks only the binaries it reaches. Where go cannot rename a
// binary into KEEP it copies over it in place, so one that a killed step
// left half-written could carry the right build ID: a binary is kept only
// as gobuild recorded it after a go build that succeeded.
//
// A go build with nothing kept (a platform's first, or a release's) waits
// for its turn when it runs beside others (side > 1, tokens in cpus): see
// coldTurn. Others run go's tools through kilnstep tool (withParallelism).
func gobuild(keep, out string, names, goArgs []string, side int, cpus string) error {
	fd, err := openLock(filepath.Join(keep, keepLockFile))
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		fmt.Fprintln(os.Stderr, "go build: waiting for another go build of these binaries (a step of a buildkitd that was killed?)")
		if err := waitLock(fd); err != nil {
			return fmt.Errorf("lock %s: %w", keepLockFile, err)
		}
	}
	var kept map[string]keptFile
	if dt, err := os.ReadFile(filepath.Join(keep, keptRecord)); err == nil {
		json.Unmarshal(dt, &kept) // an unreadable record keeps nothing
	}
	entries, err := os.ReadDir(keep)
	if err != nil {
		return err
	}
	survivors := 0
	for _, e := range entries {
		if e.Name() == keptRecord || e.Name() == lastRun || e.Name() == keepLockFile {
			continue
		}
		info, err := e.Info()
		if k, ok := kept[e.Name()]; err == nil && ok && info.Mode().IsRegular() && info.Size() == k.Size && info.ModTime().UnixNano() == k.ModTime {
			survivors++
			continue
		}
		if err := os.RemoveAll(filepath.Join(keep, e.Name())); err != nil {
			return err
		}
	}
	// The record of the go command is of its shared form, so that the
	// first edit after a cold build finds the same command.
	args := withParallelism(goArgs, side, cpus)
	run := goRun(args)
	if survivors == 0 && side > 1 && cpus != "-" {
		held, err := coldTurn(cpus, time.Now().Add(coldWait))
		if err != nil {
			return err
		}
		if held {
			// Its turn: no other cold go build runs, so it takes go's own
			// -p, without kilnstep tool started around each of its tools.
			args = goArgs
		}
	}
	// A failure from here on leaves the record naming binaries go may have
	// rewritten: their size or mtime no longer match, so they are not kept.
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	last, _ := os.ReadFile(filepath.Join(keep, lastRun))
	if survivors > 0 && string(last) == run && os.Getenv("GOTMPDIR") == "" {
		// go links into its work folder, then renames the binary into
		// KEEP, or copies it where rename cannot cross mounts (the step's
		// /tmp is a mount of its own): 57 MB copied on every relink of a
		// large binary, and the copy to OUT then read it back (0.24 s
		// against 0.03 s). The same go command as last time mostly finds
		// its packages in GOCACHE and compiles what an edit reached; any
		// other works in /tmp, which a failed build leaves nothing in.
		work := filepath.Join(keep, goWork)
		if err := os.Mkdir(work, 0o700); err != nil {
			return err
		}
		defer os.RemoveAll(work)
		cmd.Env = append(os.Environ(), "GOTMPDIR="+work)
	}
	tmp := os.TempDir()
	if dir := os.Getenv("GOTMPDIR"); dir != "" {
		tmp = dir
	}
	for _, kv := range cmd.Env {
		if dir, ok := strings.CutPrefix(kv, "GOTMPDIR="); ok {
			tmp = dir
		}
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	stop := make(chan struct{})
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		reportProgress(os.Stderr, tmp, listArgs(goArgs), stop)
	}()
	err = cmd.Wait()
	close(stop)
	<-reported
	if err != nil {
		return err
	}
	// The binaries are copied side by side (a step builds a few): the
	// copies are page-cache work the kernel does on the CPU that asks, and
	// this go build no longer uses any.
	results := make([]keptFile, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, entry := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = export(keep, out, entry, kept)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("export %s: %w", names[i], err)
		}
	}
	next := map[string]keptFile{}
	for i, entry := range names {
		name, _, _ := strings.Cut(entry, "=")
		next[name] = results[i]
	}
	for name, k := range kept {
		if _, ok := next[name]; !ok {
			if info, err := os.Stat(filepath.Join(keep, name)); err == nil && info.Size() == k.Size && info.ModTime().UnixNano() == k.ModTime {
				next[name] = k
			}
		}
	}
	dt, _ := json.Marshal(next)
	for _, f := range []struct {
		name string
		data []byte
	}{{keptRecord, dt}, {lastRun, []byte(run)}} {
		tmp := filepath.Join(keep, f.name+".tmp")
		if err := os.WriteFile(tmp, f.data, 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(keep, f.name)); err != nil {
			return err
		}
	}
	return nil
}

// export copies a binary from KEEP to OUT, as gobuild's NAMES entry says,
// and returns what to record of it.
func export(keep, out, entry string, kept map[string]keptFile) (keptFile, error) {
	name, dest, _ := strings.Cut(entry, "=")
	if dest == "" {
		dest = name
	}
	dest = filepath.Join(out, dest)
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return keptFile{}, err
	}
	sum, err := copyBlankingBuildID(filepath.Join(keep, name), dest)
	if err != nil {
		return keptFile{}, err
	}
	info, err := os.Stat(filepath.Join(keep, name))
	if err != nil {
		return keptFile{}, err
	}
	// The copy carries the time of its link: a binary go did not relink
	// leaves the step as it did last time, so kiln can tell that the copy
	// it exported then is this binary (images set their own times).
	k := keptFile{Size: info.Size(), ModTime: info.ModTime().UnixNano(), BuildID: goBuildID(filepath.Join(keep, name)), Linked: info.ModTime().UnixNano()}
	if k.BuildID == "" {
		k.Sum = sum
	}
	was := kept[name]
	if was.Linked != 0 && (k.BuildID != "" && was.BuildID == k.BuildID || k.Sum != "" && was.Sum == k.Sum) {
		k.Linked = was.Linked
	}
	linked := time.Unix(0, k.Linked)
	return k, os.Chtimes(dest, linked, linked)
}

// goBuildID is the Go build ID note of an ELF binary, "" for another
// format or none.
func goBuildID(path string) string {
	f, err := elf.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if sec := f.Section(".note.go.buildid"); sec != nil {
		if data, err := sec.Data(); err == nil {
			return string(data)
		}
	}
	return ""
}

// copyBlankingBuildID copies a binary. In an ELF binary, the Go build ID
// note and the GNU build-id note the linker derives from it are overwritten
// in place by zeros: the IDs hash the link's inputs, so code the linker
// drops would still change them; blanked, the binary is the same bytes
// whenever it links to the same program. Other formats are copied as they
// are: a Mach-O binary is signed over its build ID and has a UUID made from
// it. Their build IDs are reproducible too, only not blind to dead code.
// sum is the digest of what was written to a binary that is not ELF, ""
// for an ELF one (its build ID tells it apart): hashing a large binary
// costs more than copying it.
func copyBlankingBuildID(src, dest string) (sum string, err error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	var spans [][2]int
	f, elfErr := elf.NewFile(in)
	if elfErr == nil {
		if spans, err = elfBuildIDs(f); err != nil {
			return "", fmt.Errorf("%s: %w", src, err)
		}
	}
	out, err := os.OpenFile(dest, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return "", err
	}
	defer out.Close()
	h := sha256.New()
	var w io.Writer = out // *os.File to *os.File: copy_file_range where it can
	if elfErr != nil {
		w = io.MultiWriter(out, h)
	}
	if _, err := in.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	if _, err := io.Copy(w, in); err != nil {
		return "", err
	}
	for _, sp := range spans {
		if _, err := out.WriteAt(make([]byte, sp[1]-sp[0]), int64(sp[0])); err != nil {
			return "", err
		}
	}
	if err := out.Close(); err != nil {
		return "", err
	}
	if elfErr != nil {
		sum = hex.EncodeToString(h.Sum(nil))
	}
	return sum, nil
}

// elfBuildIDs are the file offsets [start, end) of the build IDs in the
// notes the Go linker writes; a binary without the Go note is not one it
// linked.
func elfBuildIDs(f *elf.File) ([][2]int, error) {
	var spans [][2]int
	for _, n := range []struct {
		section, owner string
		required       bool
	}{{".note.go.buildid", "Go", true}, {".note.gnu.build-id", "GNU", false}} {
		sec := f.Section(n.section)
		if sec == nil || sec.Type == elf.SHT_NOBITS {
			if n.required {
				return nil, fmt.Errorf("no %s note: not linked by the go command", n.section)
			}
			continue
		}
		note, err := sec.Data()
		if err != nil || len(note) < 12 {
			return nil, fmt.Errorf("unreadable %s note", n.section)
		}
		// namesz, descsz, type, the owner padded to 4 bytes, the ID.
		namesz, descsz := int(f.ByteOrder.Uint32(note[0:4])), int(f.ByteOrder.Uint32(note[4:8]))
		start := 12 + (namesz+3)&^3
		if namesz < 1 || 12+namesz > len(note) || string(bytes.TrimRight(note[12:12+namesz], "\x00")) != n.owner || start+descsz > len(note) {
			return nil, fmt.Errorf("malformed %s note", n.section)
		}
		off := int(sec.Offset) + start
		spans = append(spans, [2]int{off, off + descsz})
	}
	return spans, nil
}
