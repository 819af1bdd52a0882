package plan

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kiln-build/kiln/internal/uptodate"
)

// A go list run is the plan's main cost on a large tree (half a second for
// 2,000 vendored packages), and its output changes only when what go reads to
// answer it changes: the module files, and in each package directory of the
// repository the names of the files and the part of each .go file go/build
// reads (build constraints, package clause, imports, //go:embed lines). The
// list cache keeps each run's output with those inputs and answers again
// while they are the same. A file whose stat (size, modification and
// change time, inode: package uptodate) is as recorded is not read again;
// one changed within uptodate.RacyWindow of the recording is.

// On disk it is a header line, a line per input, then the output as go
// wrote it (see encodeListRecord): quoted in JSON, a large tree's output took
// longer to read than to check, and its 6,800 inputs as JSON took 19 ms.
type listRecord struct {
	Out        string
	RecordedAt int64
	Files      map[string]fileHead
	Dirs       map[string]string
}

// fileHead is one input file: its stat, and the digest of what go list reads.
type fileHead struct {
	uptodate.Stat
	Head string
}

// listCache runs go (gocmd, the go on PATH when empty) and answers from
// the runs it kept in dir; a zero one never does.
type listCache struct{ dir, gocmd string }

func (c listCache) goCommand() string {
	if c.gocmd == "" {
		return "go"
	}
	return c.gocmd
}

// Reads are the files and directories a plan's go list runs read
// (absolute paths), for a later build to tell by their stat that nothing
// changed; Unknown when a run's could not be listed.
type Reads struct {
	Files, Dirs []string
	Unknown     bool
}

func (r *Reads) add(rec *listRecord) {
	if rec == nil {
		r.Unknown = true
		return
	}
	r.Files = append(r.Files, slices.Collect(maps.Keys(rec.Files))...)
	r.Dirs = append(r.Dirs, slices.Collect(maps.Keys(rec.Dirs))...)
}

// run runs `go args...` in dir with env, or answers from the cache.
// deps gives, from the output, the package directories and files the answer
// depends on (absolute paths). What the answer depends on is added to reads.
func (c listCache) run(reads *Reads, dir string, env []string, deps func(out string) (dirs, files []string), args ...string) (string, error) {
	out, rec, err := c.answer(dir, env, deps, args)
	reads.add(rec)
	return out, err
}

// answer is run's answer, with the record of what it depends on (nil when
// there is none).
func (c listCache) answer(dir string, env []string, deps func(out string) (dirs, files []string), args []string) (string, *listRecord, error) {
	key, ok := c.key(dir, env, args)
	if !ok {
		out, err := run(dir, env, c.goCommand(), args...)
		return out, nil, err
	}
	path := filepath.Join(c.dir, key+".list")
	if rec := readListRecord(path); rec != nil && rec.current() {
		return rec.Out, rec, nil
	}
	start := time.Now()
	out, err := run(dir, env, c.goCommand(), args...)
	if err != nil {
		return out, nil, err
	}
	// An error (an import of a package that does not exist yet) can go away
	// through a change no record would see.
	if strings.Contains(out, `"Error":`) {
		return out, nil, nil
	}
	rec := &listRecord{Out: out, RecordedAt: start.UnixNano(), Files: map[string]fileHead{}, Dirs: map[string]string{}}
	dirs, files := deps(out)
	for _, d := range dirs {
		listing, goFiles, err := dirListing(d)
		if err != nil {
			return out, nil, nil // not recorded: the next run asks go again
		}
		rec.Dirs[d] = listing
		files = append(files, goFiles...)
	}
	for _, f := range files {
		h, err := readHead(f)
		if err != nil {
			return out, nil, nil
		}
		rec.Files[f] = h
	}
	c.write(path, rec)
	return out, rec, nil
}

// key names a run: the directory, the arguments, the go command and every
// variable of the environment go reads (GO*, CGO_*).
func (c listCache) key(dir string, env, args []string) (string, bool) {
	if c.dir == "" {
		return "", false
	}
	gobin, err := exec.LookPath(c.goCommand())
	if err != nil {
		return "", false
	}
	fi, err := os.Stat(gobin)
	if err != nil {
		return "", false
	}
	h := sha256.New()
	fmt.Fprintf(h, "list cache 4\n%s\n%s %d %d\n", dir, gobin, fi.Size(), fi.ModTime().UnixNano())
	for _, a := range args {
		fmt.Fprintf(h, "arg %s\n", a)
	}
	var vars []string
	for _, kv := range append(os.Environ(), env...) {
		if strings.HasPrefix(kv, "GO") || strings.HasPrefix(kv, "CGO_") {
			vars = append(vars, kv)
		}
	}
	// Later entries win, as in exec; sorting keeps their order per name.
	slices.SortStableFunc(vars, func(a, b string) int {
		ka, _, _ := strings.Cut(a, "=")
		kb, _, _ := strings.Cut(b, "=")
		return strings.Compare(ka, kb)
	})
	for i, kv := range vars {
		name, _, _ := strings.Cut(kv, "=")
		if i+1 < len(vars) && strings.HasPrefix(vars[i+1], name+"=") {
			continue // overridden, as by the pinned go's GOTOOLCHAIN and GOROOT
		}
		fmt.Fprintf(h, "env %s\n", kv)
	}
	// What `go env -w` wrote is go's environment too.
	if cfg, err := GoEnvFile(); err == nil {
		if data, err := os.ReadFile(cfg); err == nil {
			fmt.Fprintf(h, "go env file %s\n%s\n", cfg, data)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), true
}

// GoEnvFile is where `go env -w` writes: go's environment too.
func GoEnvFile() (string, error) {
	if f := os.Getenv("GOENV"); f != "" {
		return f, nil
	}
	dir, err := os.UserConfigDir()
	return filepath.Join(dir, "go", "env"), err
}

// listRecordHeader starts a record: its format, then the recording time
// and how many file and directory lines follow.
const listRecordHeader = "kiln list record 4"

// encodeListRecord writes a record as
//
//	kiln list record 3 RECORDED-AT FILES DIRS OUTPUT-BYTES
//	f SIZE MODTIME HEAD PATH   (one per file)
//	d LISTING PATH             (one per directory)
//	OUTPUT
//
// with nothing quoted: fields are split at spaces and the path takes the
// rest of its line, so a path holding a newline, or a digest holding a
// space, is not recorded (false).
func encodeListRecord(rec *listRecord) ([]byte, bool) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %d %d %d %d\n", listRecordHeader, rec.RecordedAt, len(rec.Files), len(rec.Dirs), len(rec.Out))
	for _, f := range slices.Sorted(maps.Keys(rec.Files)) {
		h := rec.Files[f]
		if strings.Contains(f, "\n") || strings.ContainsAny(h.Head, " \n") {
			return nil, false
		}
		fmt.Fprintf(&b, "f %d %d %d %d %s %s\n", h.Size, h.ModTime, h.Change, h.Inode, h.Head, f)
	}
	for _, d := range slices.Sorted(maps.Keys(rec.Dirs)) {
		l := rec.Dirs[d]
		if strings.Contains(d, "\n") || strings.ContainsAny(l, " \n") {
			return nil, false
		}
		fmt.Fprintf(&b, "d %s %s\n", l, d)
	}
	b.WriteString(rec.Out)
	return b.Bytes(), true
}

// decodeListRecord reads what encodeListRecord wrote; nil for anything else
// (another format, a file cut short anywhere, the output included).
func decodeListRecord(data []byte) *listRecord {
	line := func() ([]byte, bool) {
		l, rest, ok := bytes.Cut(data, []byte("\n"))
		data = rest
		return l, ok
	}
	header, ok := line()
	rest, isRecord := strings.CutPrefix(string(header), listRecordHeader+" ")
	counts := strings.Split(rest, " ")
	if !ok || !isRecord || len(counts) != 4 {
		return nil
	}
	var n [4]int64
	for i, c := range counts {
		var err error
		if n[i], err = strconv.ParseInt(c, 10, 64); err != nil || i > 0 && n[i] < 0 {
			return nil
		}
	}
	// Each input is a line at least: a count beyond the lines left is a
	// damaged file, not a map to allocate.
	lines := int64(bytes.Count(data, []byte("\n")))
	if n[1]+n[2] > lines || n[1] > lines || n[2] > lines {
		return nil
	}
	rec := &listRecord{RecordedAt: n[0], Files: make(map[string]fileHead, n[1]), Dirs: make(map[string]string, n[2])}
	for range n[1] {
		l, ok := line()
		fields := strings.SplitN(string(l), " ", 7)
		if !ok || len(fields) != 7 || fields[0] != "f" {
			return nil
		}
		size, err1 := strconv.ParseInt(fields[1], 10, 64)
		mod, err2 := strconv.ParseInt(fields[2], 10, 64)
		change, err3 := strconv.ParseInt(fields[3], 10, 64)
		inode, err4 := strconv.ParseUint(fields[4], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
			return nil
		}
		rec.Files[fields[6]] = fileHead{Stat: uptodate.Stat{Size: size, ModTime: mod, Change: change, Inode: inode}, Head: fields[5]}
	}
	for range n[2] {
		l, ok := line()
		fields := strings.SplitN(string(l), " ", 3)
		if !ok || len(fields) != 3 || fields[0] != "d" {
			return nil
		}
		rec.Dirs[fields[2]] = fields[1]
	}
	if int64(len(data)) != n[3] {
		return nil
	}
	rec.Out = string(data)
	return rec
}

func readListRecord(path string) *listRecord {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return decodeListRecord(data)
}

// maxListRecords bounds the cache: each tree, platform and environment
// has one record, and temporary trees (tests, bench copies) leave theirs.
const maxListRecords = 64

func (c listCache) write(path string, rec *listRecord) {
	data, ok := encodeListRecord(rec)
	if !ok || os.MkdirAll(filepath.Dir(path), 0o755) != nil {
		return
	}
	if entries, err := os.ReadDir(c.dir); err == nil && len(entries) >= maxListRecords {
		type aged struct {
			name string
			mod  time.Time
		}
		var all []aged
		for _, e := range entries {
			if fi, err := e.Info(); err == nil {
				all = append(all, aged{e.Name(), fi.ModTime()})
			}
		}
		slices.SortFunc(all, func(a, b aged) int { return a.mod.Compare(b.mod) })
		for _, e := range all[:len(all)-maxListRecords+1] {
			os.Remove(filepath.Join(c.dir, e.name))
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return
	}
	_, werr := tmp.Write(data)
	if cerr := tmp.Close(); werr != nil || cerr != nil || os.Rename(tmp.Name(), path) != nil {
		os.Remove(tmp.Name())
	}
}

// current reports whether every input is as recorded. The checks run on
// every CPU: on a vendored tree they are 1,200 directory listings and 5,600
// stats (60 ms on one core), and the build waits for them.
func (rec *listRecord) current() bool {
	var stale atomic.Bool
	checks := make(chan func() bool, 256)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for check := range checks {
				if !stale.Load() && !check() {
					stale.Store(true)
				}
			}
		}()
	}
	for d, want := range rec.Dirs {
		if stale.Load() {
			break
		}
		checks <- func() bool {
			got, _, err := dirListing(d)
			return err == nil && got == want
		}
	}
	for f, want := range rec.Files {
		if stale.Load() {
			break
		}
		checks <- func() bool { return rec.fileCurrent(f, want) }
	}
	close(checks)
	wg.Wait()
	return !stale.Load()
}

// fileCurrent reports whether a file go list read is as recorded: by its
// stat when it was old enough at the recording to trust, else by what go
// list reads of it.
func (rec *listRecord) fileCurrent(f string, want fileHead) bool {
	st, ok := uptodate.StatPath(f)
	if st.Size < 0 {
		return false
	}
	racy := max(st.ModTime, st.Change) > rec.RecordedAt-int64(uptodate.RacyWindow)
	if ok && st == want.Stat && !racy {
		return true
	}
	got, err := readHead(f)
	return err == nil && got.Head == want.Head
}

// dirListing is the digest of a package directory's entry names and kinds,
// with the .go files in it.
func dirListing(dir string) (string, []string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", nil, err
	}
	h := sha256.New()
	var goFiles []string
	for _, e := range entries {
		fmt.Fprintf(h, "%s %d\n", e.Name(), e.Type())
		if strings.HasSuffix(e.Name(), ".go") && e.Type().IsRegular() {
			goFiles = append(goFiles, filepath.Join(dir, e.Name()))
		}
	}
	return hex.EncodeToString(h.Sum(nil)), goFiles, nil
}

// readHead reads a file's stat and the digest of what go list reads of it:
// for a .go file, everything up to the end of its imports and its //go:embed
// lines; for any other file, all of it.
func readHead(path string) (fileHead, error) {
	f, err := os.Open(path)
	if err != nil {
		return fileHead{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fileHead{}, err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fileHead{}, err
	}
	head := data
	if strings.HasSuffix(path, ".go") {
		head = goHead(path, data)
	}
	sum := sha256.Sum256(head)
	st, _ := uptodate.StatOf(fi)
	return fileHead{Stat: st, Head: hex.EncodeToString(sum[:])}, nil
}

func goHead(path string, src []byte) []byte {
	file, err := parser.ParseFile(token.NewFileSet(), path, src, parser.ImportsOnly|parser.ParseComments)
	if err != nil {
		return src // go list reports the error; any change may change it
	}
	end := file.Name.End()
	for _, imp := range file.Imports {
		end = max(end, imp.End())
	}
	var buf bytes.Buffer
	buf.Write(src[:int(end)-1])
	for line := range bytes.Lines(src[int(end)-1:]) {
		if t := bytes.TrimSpace(line); bytes.HasPrefix(t, []byte("//go:embed")) {
			buf.WriteString("\n")
			buf.Write(t)
		}
	}
	return buf.Bytes()
}

// subdirs are dir and every folder under it, for packages that embed files:
// a new file anywhere below may match an embed pattern.
func subdirs(dir string) []string {
	var out []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() {
			// Files of another module are never embedded.
			if path != dir && exists(filepath.Join(path, "go.mod")) {
				return filepath.SkipDir
			}
			out = append(out, path)
		}
		return nil
	})
	return out
}

// ModuleEnv is `go env -json keys...` run in dir, answered from the list cache
// in cacheDir while the go command, its environment and dir's module files
// are the same. A variable of the environment that holds credentials (a
// GOPROXY with user:password@) is never written to the cache: go is asked.
func ModuleEnv(cacheDir, dir string, keys ...string) (string, error) {
	args := append([]string{"env", "-json"}, keys...)
	for _, k := range keys {
		if strings.Contains(os.Getenv(k), "@") {
			return run(dir, nil, "go", args...)
		}
	}
	deps := func(string) (dirs, files []string) {
		for _, name := range []string{"go.mod", "go.work"} {
			if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
				files = append(files, filepath.Join(dir, name))
			}
		}
		return nil, files
	}
	return listCache{dir: cacheDir}.run(&Reads{}, dir, nil, deps, args...)
}
