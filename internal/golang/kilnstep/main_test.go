package main

import (
	"bufio"
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestBlankedBuildIDsMakeDeadCodeInvisible links a program twice, the
// second time with a variable the linker drops. The ELF binaries differ in
// their build IDs alone and are equal once blanked, and the blanked binary
// runs. Other formats are copied unchanged (a Mach-O binary is signed over
// its build ID): any file elf cannot open takes that path, so a text file
// stands for them, where a Windows build would compile its standard library.
func TestBlankedBuildIDsMakeDeadCodeInvisible(t *testing.T) {
	if testing.Short() {
		t.Skip("links two programs")
	}
	dir := t.TempDir()
	const program = "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"blanked\") }\n"
	write := func(content string) {
		files := map[string]string{"go.mod": "module blank\n\ngo 1.26\n", "main.go": content}
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	link := func(out string) string {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		return filepath.Join(dir, out)
	}
	write(program)
	a := link("a")
	write(program + "\nvar dropped = 1\n")
	b := link("b")
	for _, f := range []string{a, b} {
		if _, err := copyBlankingBuildID(f, f+".copy"); err != nil {
			t.Fatal(err)
		}
	}
	read := func(f string) []byte {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	if bytes.Equal(read(a), read(b)) {
		t.Fatal("the dead code changed no byte: this test proves nothing")
	}
	if !bytes.Equal(read(a+".copy"), read(b+".copy")) {
		t.Error("the blanked binaries differ")
	}
	f, err := elf.Open(a + ".copy")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	spans, err := elfBuildIDs(f)
	if err != nil || len(spans) != 2 {
		t.Fatalf("build ID notes %v, %v; want the Go and the GNU one", spans, err)
	}
	copied := read(a + ".copy")
	for _, sp := range spans {
		if sp[1] <= sp[0] || len(bytes.Trim(copied[sp[0]:sp[1]], "\x00")) != 0 {
			t.Errorf("build ID bytes %d-%d left: %q", sp[0], sp[1], copied[sp[0]:sp[1]])
		}
	}
	if out, err := exec.Command(a + ".copy").Output(); err != nil || string(out) != "blanked\n" {
		t.Errorf("the blanked binary ran: %q, %v", out, err)
	}
	other := filepath.Join(dir, "go.mod")
	if sum, err := copyBlankingBuildID(other, filepath.Join(dir, "x")); err != nil || sum == "" {
		t.Errorf("a file that is not ELF: digest %q, %v", sum, err)
	}
	if !bytes.Equal(read(other), read(filepath.Join(dir, "x"))) {
		t.Error("a file that is not ELF was changed")
	}
}

func TestGoBuildsSideBySideShareTheCPUs(t *testing.T) {
	args := []string{"/usr/local/go/bin/go", "build", "-trimpath", "-o", "/kiln/keep/", "./cmd/a"}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	split := fmt.Sprintf("-p=%d", (runtime.GOMAXPROCS(0)+1)/2)
	for _, c := range []struct {
		goflags string
		side    int
		cpus    string
		want    string // the flag after build; "" leaves the arguments unchanged
	}{
		{"-mod=vendor", 1, "-", ""},
		{"-mod=vendor", 2, "/kiln/cpus", "-toolexec=" + self + " tool /kiln/cpus"},
		{"-mod=vendor", 2, "-", split},
		{"-mod=vendor -toolexec=strace", 2, "/kiln/cpus", split},
		{"-mod=vendor -p=3", 2, "-", ""},
		{"-toolexec=strace -p=3", 2, "/kiln/cpus", ""},
		{"--toolexec=strace", 2, "/kiln/cpus", split},
		{"--toolexec strace --p 3", 2, "/kiln/cpus", ""},
		{"'-ldflags=-X a=b -p=3 -toolexec=x' -mod=vendor", 2, "/kiln/cpus", "-toolexec=" + self + " tool /kiln/cpus"},
	} {
		t.Setenv("GOFLAGS", c.goflags)
		got := withParallelism(args, c.side, c.cpus)
		want := args
		if c.want != "" {
			want = append(append(slices.Clone(args[:2]), c.want), args[2:]...)
		}
		if !slices.Equal(got, want) {
			t.Errorf("GOFLAGS=%q, %d side by side, CPUS %s: %q, want %q", c.goflags, c.side, c.cpus, got, want)
		}
	}
}

// Tools run through kilnstep tool take turns on GOMAXPROCS tokens: no more
// run at once, go asking for a version never waits, and a token comes back
// when its tool dies.
func TestToolsTakeTurnsOnTheCPUTokens(t *testing.T) {
	dir, kilnstep := buildKilnstep(t)
	cpus, logs := filepath.Join(dir, "cpus"), filepath.Join(dir, "logs")
	t.Run("go builds the same through it", func(t *testing.T) {
		identical(t, kilnstep)
	})
	for _, d := range []string{cpus, logs} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The tool logs when it starts and ends; -V=full ends at once, and
	// a third argument makes it sleep in its own place, as a holder that
	// can be killed.
	tool := filepath.Join(dir, "tool")
	script := "#!/bin/sh\n[ \"$1\" = -V=full ] && exit 0\necho start $(date +%s%N) >> " + logs + "/$1\n[ -n \"$3\" ] && exec sleep $2\nsleep ${2:-0.3}\necho end $(date +%s%N) >> " + logs + "/$1\n"
	if err := os.WriteFile(tool, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) *exec.Cmd {
		cmd := exec.Command(kilnstep, append([]string{"tool", cpus, tool}, args...)...)
		cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}

	var cmds []*exec.Cmd
	for i := range 6 {
		cmds = append(cmds, run(strconv.Itoa(i)))
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	type event struct {
		at    int64
		delta int
	}
	var events []event
	for i := range 6 {
		dt, err := os.ReadFile(filepath.Join(logs, strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(dt)), "\n") {
			kind, at, _ := strings.Cut(line, " ")
			n, err := strconv.ParseInt(at, 10, 64)
			if err != nil {
				t.Fatalf("tool %d logged %q", i, line)
			}
			events = append(events, event{n, map[string]int{"start": 1, "end": -1}[kind]})
		}
	}
	slices.SortFunc(events, func(a, b event) int { return cmp.Compare(a.at, b.at)*2 + cmp.Compare(a.delta, b.delta) })
	running, most := 0, 0
	for _, e := range events {
		running += e.delta
		most = max(most, running)
	}
	// Fewer than two at once is a machine too loaded to start them in
	// 0.3 s; that two tokens can be held shows below.
	if len(events) != 12 || most > 2 {
		t.Errorf("%d events, at most %d tools at once; want 12 and no more than 2 (the tokens)", len(events), most)
	}

	t.Run("two large compiles never run at once; a small one runs beside a large one", func(t *testing.T) {
		largeCompiles(t, kilnstep)
	})

	// Both tokens held, by tools that outlive the test's patience: a
	// version question runs, a third tool waits, and gets a token when one
	// of them is killed.
	holders := []*exec.Cmd{run("h1", "60", "exec"), run("h2", "60", "exec")}
	defer func() {
		for _, h := range holders {
			h.Process.Kill()
			h.Wait()
		}
	}()
	waitFor := func(name string) bool {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(logs, name)); err == nil {
				return true
			}
		}
		return false
	}
	if !waitFor("h1") || !waitFor("h2") {
		t.Fatal("the two holders did not start")
	}
	for _, h := range holders {
		if n := flocksHeld(t, h.Process.Pid); n != 1 {
			t.Errorf("a running tool holds %d locks, want its one token", n)
		}
	}
	version := run("-V=full")
	done := make(chan error, 1)
	go func() { done <- version.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("-V=full: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("-V=full waited for a token")
	}
	third, fourth := run("third", "0"), run("fourth", "0")
	// Both wait in the kernel, one in the queue and one on the tokens,
	// where polling would wake each every few milliseconds.
	for _, w := range []*exec.Cmd{third, fourth} {
		if !waitInFlock(w.Process.Pid) {
			t.Errorf("a waiting tool (%d) is not blocked in flock", w.Process.Pid)
		}
	}
	if _, err := os.Stat(filepath.Join(logs, "third")); err == nil {
		t.Fatal("a third tool ran while both tokens were held")
	}
	holders[0].Process.Kill()
	if !waitFor("third") || !waitFor("fourth") {
		t.Error("the token of a killed tool did not come back to both waiters in turn")
	}
	for _, w := range []*exec.Cmd{third, fourth} {
		if err := w.Wait(); err != nil {
			t.Error(err)
		}
	}
}

// flocksHeld counts the flock locks that /proc/locks gives to the process.
func flocksHeld(t *testing.T, pid int) int {
	dt, err := os.ReadFile("/proc/locks")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(dt), "\n") {
		// 1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF; a waiter's
		// lines start "1: -> FLOCK".
		if f := strings.Fields(line); len(f) > 4 && f[1] == "FLOCK" && f[4] == strconv.Itoa(pid) {
			n++
		}
	}
	return n
}

// waitInFlock says whether a thread of the process is blocked in flock
// within a few seconds.
func waitInFlock(pid int) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, task := range tasks {
			dt, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/syscall", pid, task.Name()))
			if nr, _, ok := strings.Cut(string(dt), " "); err == nil && ok && nr == strconv.Itoa(syscall.SYS_FLOCK) {
				return true
			}
		}
	}
	return false
}

// largeCompiles runs tools named compile through kilnstep: L1 and L2 get
// large packages, S a small one, and each logs when it runs.
func largeCompiles(t *testing.T, kilnstep string) {
	dir := t.TempDir()
	cpus, logs := filepath.Join(dir, "cpus"), filepath.Join(dir, "logs")
	os.Mkdir(cpus, 0o755)
	os.Mkdir(logs, 0o755)
	large, small := filepath.Join(dir, "large.go"), filepath.Join(dir, "small.go")
	os.WriteFile(large, bytes.Repeat([]byte("// large\n"), largeCompile/9+1), 0o644)
	os.WriteFile(small, []byte("package small\n"), 0o644)
	compile := filepath.Join(dir, "compile")
	// A compile runs for $2 seconds, or, named instead, until that one has
	// started (a minute at most): a fixed time could pass before a loaded
	// machine starts the other.
	script := "#!/bin/sh\necho start $(date +%s%N) >> " + logs + "/$1\ncase $2 in\n[0-9]*) sleep $2 ;;\n*) i=0; while [ ! -e " + logs + "/$2 ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done ;;\nesac\necho end $(date +%s%N) >> " + logs + "/$1\n"
	if err := os.WriteFile(compile, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) *exec.Cmd {
		cmd := exec.Command(kilnstep, append([]string{"tool", cpus, compile}, args...)...)
		cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	times := func(name string) (start, end int64) {
		dt, err := os.ReadFile(filepath.Join(logs, name))
		if err != nil {
			t.Fatalf("%s did not run: %v", name, err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(dt)), "\n") {
			kind, at, _ := strings.Cut(line, " ")
			n, _ := strconv.ParseInt(at, 10, 64)
			if kind == "start" {
				start = n
			} else {
				end = n
			}
		}
		return start, end
	}
	l1 := run("L1", "S", large)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(logs, "L1")); err == nil {
			break
		}
	}
	cmds := []*exec.Cmd{l1, run("L2", "0.2", large), run("S", "0.2", small)}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	s1, e1 := times("L1")
	s2, e2 := times("L2")
	ss, _ := times("S")
	if s2 < e1 && s1 < e2 {
		t.Error("two large compiles ran at once")
	}
	if ss > e1 {
		t.Error("a small compile waited for a large one with a CPU token free")
	}
}

// A tool waits for a token no longer than it is told, and tokens that are
// not plain files (planted by another build on the daemon) are refused.
func TestCPUTokensThatNeverComeOrAreNotFiles(t *testing.T) {
	cpus := t.TempDir()
	t.Setenv("GOMAXPROCS", "2")
	prev := runtime.GOMAXPROCS(2)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	for i := range 2 {
		f, err := os.Create(filepath.Join(cpus, strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if err := takeCPU(cpus, time.Now().Add(100*time.Millisecond)); err != nil {
		t.Errorf("a tool whose tokens never came: %v, want it to run without one", err)
	}
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Errorf("the tool waited %s while both tokens were held", waited)
	}

	planted := t.TempDir()
	if err := os.Mkdir(filepath.Join(planted, "0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(t.TempDir(), "target"), filepath.Join(planted, "1")); err != nil {
		t.Fatal(err)
	}
	if err := takeCPU(planted, time.Now().Add(time.Second)); err == nil || !strings.Contains(err.Error(), filepath.Join(planted, "0")) {
		t.Errorf("a directory as token 0: %v, want an error naming it", err)
	}
	os.Remove(filepath.Join(planted, "0"))
	if err := takeCPU(planted, time.Now().Add(time.Second)); err == nil || !strings.Contains(err.Error(), filepath.Join(planted, "1")) {
		t.Errorf("a symbolic link as token 1: %v, want an error naming it", err)
	}
}

// A binary go finds up to date leaves the step with the time of its link,
// though go touched it; a relinked one with the time of its new link.
func TestABinaryGoDidNotRelinkKeepsItsLinkTime(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build six times")
	}
	// A Windows binary is not ELF: gobuild cannot read its build ID and
	// tells it by its bytes.
	for _, goos := range []string{"linux", "windows"} {
		t.Run(goos, func(t *testing.T) {
			src, keep := t.TempDir(), t.TempDir()
			name := "kept"
			if goos == "windows" {
				name += ".exe"
			}
			write := func(main string) {
				for name, data := range map[string]string{"go.mod": "module kept\n\ngo 1.26\n", "main.go": main} {
					if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			build := func() time.Time {
				t.Helper()
				out := t.TempDir()
				t.Chdir(src)
				t.Setenv("CGO_ENABLED", "0")
				t.Setenv("GOFLAGS", "")
				t.Setenv("GOOS", goos)
				// The linux binary goes to an output of its own, laid out
				// as it is exported (NAME=PATH).
				entry, dest := name, name
				if goos == "linux" {
					dest = "0/linux_amd64/" + name
					entry = name + "=" + dest
				}
				if err := gobuild(keep, out, []string{entry}, []string{"go", "build", "-trimpath", "-o", keep + "/", "."}, 1, "-"); err != nil {
					t.Fatal(err)
				}
				fi, err := os.Stat(filepath.Join(out, dest))
				if err != nil {
					t.Fatal(err)
				}
				return fi.ModTime()
			}
			write("package main\n\nfunc main() {}\n")
			first := build()
			if again := build(); !again.Equal(first) {
				t.Errorf("an up-to-date binary left the step at %v, linked at %v", again, first)
			}
			write("package main\n\nfunc main() { println() }\n")
			if relinked := build(); relinked.Equal(first) {
				t.Error("a relinked binary kept the time of the link before")
			}
		})
	}
}

// identical builds a program through kilnstep tool, then without it on the
// same Go cache: go finds every package it compiled (the same cache keys)
// and links the same bytes. The program's packages are new to the cache
// on every run; the standard library's may be cached already.
func identical(t *testing.T, kilnstep string) {
	src, cpus := t.TempDir(), t.TempDir()
	files := map[string]string{
		"go.mod":     "module same\n\ngo 1.26\n",
		"main.go":    "package main\n\nimport \"same/lib\"\n\nfunc main() { println(lib.Name, lib.Add(1, 2)) }\n",
		"lib/lib.go": fmt.Sprintf("package lib\n\nconst Name = \"same %d\"\n\nfunc Add(a, b int) int\n", time.Now().UnixNano()),
		"lib/add.s":  "#include \"textflag.h\"\n\nTEXT ·Add(SB),NOSPLIT,$0-24\n\tMOVQ a+0(FP), AX\n\tADDQ b+8(FP), AX\n\tMOVQ AX, ret+16(FP)\n\tRET\n",
	}
	for name, data := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(src, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	build := func(out string, args ...string) string {
		cmd := exec.Command("go", append(append([]string{"build", "-x", "-trimpath"}, args...), "-o", out, ".")...)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOARCH=amd64", "GOFLAGS=")
		trace, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go build %v: %v\n%s", args, err, trace)
		}
		return string(trace)
	}
	through := build(filepath.Join(src, "through"), "-toolexec="+kilnstep+" tool "+cpus)
	if !strings.Contains(through, kilnstep+" tool "+cpus+" ") || !strings.Contains(through, "/asm ") {
		t.Fatalf("go build did not run its compiles and assembly through kilnstep:\n%s", through)
	}
	plain := build(filepath.Join(src, "plain"))
	for _, line := range strings.Split(plain, "\n") {
		if strings.Contains(line, "/compile ") || strings.Contains(line, "/asm ") {
			t.Errorf("without kilnstep, go compiled again (other cache keys): %s", line)
		}
	}
	a, _ := os.ReadFile(filepath.Join(src, "through"))
	b, _ := os.ReadFile(filepath.Join(src, "plain"))
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Errorf("the binaries differ (%d and %d bytes)", len(a), len(b))
	}
}

// A build that keeps binaries, with the go command of the last, has go
// work in KEEP, so that a relinked binary is renamed into place rather
// than copied; a first build, or one with other flags, works in the step's
// tmpfs. The work folder goes when go ends, and one that a
// killed build left goes before the next starts.
func TestRelinksWorkBesideTheKeptBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build five times")
	}
	src, keep := t.TempDir(), t.TempDir()
	logs := t.TempDir()
	seen, trace := filepath.Join(logs, "gotmpdir"), filepath.Join(logs, "trace")
	// As in a step, go's temporary folder is on another file system than
	// KEEP, where one is at hand: a rename cannot cross, so go copies.
	var keepStat, shmStat syscall.Stat_t
	crossing := syscall.Stat(keep, &keepStat) == nil && syscall.Stat("/dev/shm", &shmStat) == nil && keepStat.Dev != shmStat.Dev
	if crossing {
		t.Setenv("TMPDIR", "/dev/shm")
	}
	// go's stand-in says where go would work, and whether that folder is
	// there and empty, then runs go, which says what it ran (-x).
	wrapper := filepath.Join(logs, "go")
	script := "#!/bin/sh\nif [ -n \"$GOTMPDIR\" ] && [ -d \"$GOTMPDIR\" ] && [ -z \"$(ls -A \"$GOTMPDIR\")\" ]; then echo \"$GOTMPDIR\" >" + seen + "; else echo \"${GOTMPDIR:-none}\" >" + seen + "; fi\nexec go \"$@\" 2>" + trace + "\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(src)
	t.Setenv("CGO_ENABLED", "0")
	t.Setenv("GOFLAGS", "")
	t.Setenv("GOTMPDIR", "")
	// build says where go worked and how the binary reached KEEP: "mv" or
	// "cp".
	build := func(main string, flags ...string) (string, string) {
		t.Helper()
		for name, data := range map[string]string{"go.mod": "module kept\n\ngo 1.26\n", "main.go": main} {
			if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		args := append(append([]string{wrapper, "build", "-x", "-trimpath"}, flags...), "-o", keep+"/", ".")
		if err := gobuild(keep, t.TempDir(), []string{"kept"}, args, 1, "-"); err != nil {
			t.Fatal(err)
		}
		dt, err := os.ReadFile(seen)
		if err != nil {
			t.Fatal(err)
		}
		x, err := os.ReadFile(trace)
		if err != nil {
			t.Fatal(err)
		}
		moved := ""
		for _, line := range strings.Split(string(x), "\n") {
			if f := strings.Fields(line); len(f) == 3 && (f[0] == "mv" || f[0] == "cp") && strings.HasSuffix(f[1], "/exe/a.out") && f[2] == filepath.Join(keep, "kept") {
				moved = f[0]
			}
		}
		return strings.TrimSpace(string(dt)), moved
	}
	work := filepath.Join(keep, goWork)
	if got, moved := build("package main\n\nfunc main() {}\n"); got != "none" || crossing && moved != "cp" {
		t.Errorf("a first build worked in %s and its binary reached KEEP by %q, want the step's tmpfs (and cp across file systems)", got, moved)
	}
	if got, moved := build("package main\n\nfunc main() { println(1) }\n"); got != work || moved != "mv" {
		t.Errorf("a build with a kept binary worked in %s and its binary reached KEEP by %q, want an empty %s and mv", got, moved, work)
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("the work folder is left after the build: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(work, "b001"), 0o755); err != nil { // a killed build's
		t.Fatal(err)
	}
	if got, moved := build("package main\n\nfunc main() { println(2) }\n"); got != work || moved != "mv" {
		t.Errorf("after a killed build's work folder, go worked in %s and its binary reached KEEP by %q, want an empty %s and mv", got, moved, work)
	}
	// Other flags may compile every package again: in the tmpfs.
	if got, moved := build("package main\n\nfunc main() { println(3) }\n", "-ldflags=-s"); got != "none" || crossing && moved != "cp" {
		t.Errorf("a build with other flags worked in %s and its binary reached KEEP by %q, want the step's tmpfs (and cp across file systems)", got, moved)
	}
	if got, moved := build("package main\n\nfunc main() { println(2) }\n", "-ldflags=-s"); got != work || moved != "mv" {
		t.Errorf("the same flags again worked in %s and the binary reached KEEP by %q, want an empty %s and mv", got, moved, work)
	}
	if dt, _ := os.ReadFile(filepath.Join(keep, keptRecord)); strings.Contains(string(dt), goWork) {
		t.Errorf("the kept record names the work folder: %s", dt)
	}
	out, err := exec.Command(filepath.Join(keep, "kept")).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "2" {
		t.Errorf("the relinked binary printed %q (%v), want 2", out, err)
	}
}

// BuildKit's lock of a locked cache mount holds within one daemon: the
// steps of a killed daemon run on beside a restarted one's (the managed
// daemon's start ends them; a daemon elsewhere may not). So a go build
// waits for the one that holds KEEP, and only then runs go.
func TestAGoBuildWaitsForTheOneThatHoldsItsKeep(t *testing.T) {
	src, keep := t.TempDir(), t.TempDir()
	ran := filepath.Join(t.TempDir(), "ran")
	wrapper := filepath.Join(t.TempDir(), "go")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\ntouch "+ran+"\nexec go \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"go.mod": "module kept\n\ngo 1.26\n", "main.go": "package main\n\nfunc main() {}\n"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(src)
	t.Setenv("CGO_ENABLED", "0")
	t.Setenv("GOFLAGS", "")
	held, err := openLock(filepath.Join(keep, keepLockFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(held, syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- gobuild(keep, t.TempDir(), []string{"kept"}, []string{wrapper, "build", "-trimpath", "-o", keep + "/", "."}, 1, "-")
	}()
	if !waitInFlock(os.Getpid()) {
		t.Error("the go build did not wait for KEEP's lock")
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("go ran while another go build held KEEP")
	}
	syscall.Close(held)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ran); err != nil {
		t.Error("go did not run once KEEP was free")
	}
	if dt, _ := os.ReadFile(filepath.Join(keep, keptRecord)); !strings.Contains(string(dt), `"kept"`) || strings.Contains(string(dt), keepLockFile) {
		t.Errorf("the kept record should name the binary and not the lock: %s", dt)
	}
}

// TestAGoBuildSaysHowManyPackagesItCompiled: while go runs, its work
// folder's action folders are counted and, once go list has named the
// build's packages, the line names the total.
func TestAGoBuildSaysHowManyPackagesItCompiled(t *testing.T) {
	defer func(was time.Duration) { progressEvery = was }(progressEvery)
	progressEvery = 20 * time.Millisecond
	tmp := t.TempDir()
	work := filepath.Join(tmp, "go-build1234")
	for _, b := range []string{"b001", "b002"} {
		os.MkdirAll(filepath.Join(work, b), 0o755)
	}
	os.WriteFile(filepath.Join(work, "importcfg"), nil, 0o644) // not an action
	// The listing ends once the test says so, as a slow go list would (or
	// after 30 s, should the test end first).
	gate := filepath.Join(t.TempDir(), "listed")
	list := []string{"sh", "-c", `i=0; while [ ! -e "$0" ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done; printf 'a\nb\nc\nd\ne\n'`, gate}
	var out safeBuffer
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		reportProgress(&out, tmp, list, stop)
	}()
	waitFor := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), want); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the progress:\n%s", want, out.String())
			}
		}
	}
	waitFor("go build: 2 packages compiled")
	time.Sleep(100 * time.Millisecond) // periods with nothing new print nothing
	os.WriteFile(gate, nil, 0o644)
	waitFor("go build: 2/5 packages compiled")
	os.MkdirAll(filepath.Join(work, "b003"), 0o755)
	waitFor("go build: 3/5 packages compiled")
	close(stop)
	<-done
	for _, line := range []string{"go build: 2 packages", "go build: 2/5 packages"} {
		if n := strings.Count(out.String(), line); n != 1 {
			t.Errorf("%q was printed %d times:\n%s", line, n, out.String())
		}
	}
}

func TestListArgsNameTheBuildsPackages(t *testing.T) {
	got := listArgs([]string{"/go/bin/go", "build", "-trimpath", "-tags=netgo,osusergo", "-ldflags=-s -w", "-o", "/keep/", "./cmd/a", "./cmd/b"})
	want := []string{"/go/bin/go", "list", "-deps", "-tags=netgo,osusergo", "./cmd/a", "./cmd/b"}
	if !slices.Equal(got, want) {
		t.Errorf("listArgs: %q, want %q", got, want)
	}
	if got := listArgs([]string{"/go/bin/go", "version"}); got != nil {
		t.Errorf("listArgs of go version: %q", got)
	}
}

// safeBuffer is a bytes.Buffer one goroutine writes and another reads.
type safeBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *safeBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *safeBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestColdGoBuildsTakeTurns: a go build that keeps no binary from an
// earlier one waits while another cold go build runs beside it, then runs
// go with go's own parallelism, no tool wrapped; one with binaries kept
// (an edit) or running alone does not wait, and an edit beside another
// build runs its tools through kilnstep tool.
func TestColdGoBuildsTakeTurns(t *testing.T) {
	dir, kilnstep := buildKilnstep(t)
	cpus := filepath.Join(dir, "cpus")
	os.Mkdir(cpus, 0o755)
	// The test is the other cold go build: it holds the gate.
	gate, err := openLock(filepath.Join(cpus, coldGate))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(gate, syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	warm := t.TempDir()
	os.WriteFile(filepath.Join(warm, "agent"), []byte("linked before"), 0o755)
	fi, _ := os.Stat(filepath.Join(warm, "agent"))
	record, _ := json.Marshal(map[string]keptFile{"agent": {Size: fi.Size(), ModTime: fi.ModTime().UnixNano()}})
	os.WriteFile(filepath.Join(warm, keptRecord), record, 0o644)
	// gobuild runs a stand-in for go that says it ran.
	fakeGo := filepath.Join(dir, "go")
	os.WriteFile(fakeGo, []byte("#!/bin/sh\necho \"$@\" >\"$MARKER\"\n"), 0o755)
	start := func(keep, side, marker string) (*exec.Cmd, *bufio.Reader) {
		t.Helper()
		cmd := exec.Command(kilnstep, "gobuild", keep, t.TempDir(), "", side, cpus, "--", fakeGo, "build", "./cmd/agent")
		cmd.Env = append(os.Environ(), "MARKER="+marker)
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, bufio.NewReader(stderr)
	}
	ran := func(marker string) bool {
		_, err := os.Stat(marker)
		return err == nil
	}
	goArgs := func(marker string) string {
		dt, _ := os.ReadFile(marker)
		return strings.TrimSpace(string(dt))
	}
	for _, tt := range []struct {
		name, keep, side, args string
	}{
		{"an edit beside a cold build", warm, "2", "build -toolexec=" + kilnstep + " tool " + cpus + " ./cmd/agent"},
		{"a cold build alone", t.TempDir(), "1", "build ./cmd/agent"},
	} {
		marker := filepath.Join(t.TempDir(), "ran")
		cmd, stderr := start(tt.keep, tt.side, marker)
		said, _ := io.ReadAll(stderr)
		if err := cmd.Wait(); err != nil || !ran(marker) || strings.Contains(string(said), "waiting") {
			t.Errorf("%s: %v, ran %v, said %q; want it to run at once", tt.name, err, ran(marker), said)
		}
		if got := goArgs(marker); got != tt.args {
			t.Errorf("%s ran go %s, want go %s", tt.name, got, tt.args)
		}
	}
	marker := filepath.Join(t.TempDir(), "ran")
	cmd, stderr := start(t.TempDir(), "2", marker)
	line, err := stderr.ReadString('\n')
	if err != nil || !strings.Contains(line, "cold builds take turns") {
		t.Fatalf("a cold build beside another said %q (%v)", line, err)
	}
	if ran(marker) {
		t.Error("a cold build ran go beside another cold build")
	}
	syscall.Close(gate)
	io.Copy(io.Discard, stderr)
	if err := cmd.Wait(); err != nil || !ran(marker) {
		t.Errorf("the cold build, once the other ended: %v, ran %v", err, ran(marker))
	}
	if got := goArgs(marker); got != "build ./cmd/agent" {
		t.Errorf("the cold build in its turn ran go %s, want go build ./cmd/agent (go's own -p, no wrapper)", got)
	}
}

// buildKilnstep compiles kilnstep into a new folder, which it returns
// with the binary's path.
func buildKilnstep(t *testing.T) (string, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds kilnstep")
	}
	dir := t.TempDir()
	kilnstep := filepath.Join(dir, "kilnstep")
	if out, err := exec.Command("go", "build", "-o", kilnstep, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build kilnstep: %v\n%s", err, out)
	}
	return dir, kilnstep
}
