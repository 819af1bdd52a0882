package build

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/explain"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/verify"
)

// A no-op build is answered before the plan is resolved or BuildKit is
// contacted. After a build, kiln records the stat (size, modification time)
// of every file and directory it read: the configuration, what go list
// read (module files, each package directory and its files), the binaries'
// sources, the images' files, and the outputs it wrote. The next build with
// the same kiln executable, flags, environment and git commit whose files
// all stat the same is the same build: it returns the recorded outcome, as
// make and git's index trust a stat. A directory's modification time
// changes when an entry is added, removed or renamed. An input modified
// within racyWindow before the build started could change again without a
// visible stat change, so such a build records nothing, as git treats
// "racily clean" entries.
const noopFile = "no-op-%s.json"

// noopMarker says the last images build was a recorded no-op, so explain
// reports every step of the last record as reused.
const noopMarker = "no-op"

// racyWindow is how old an input must be when the build starts for its
// stat to be trusted; a variable so tests need not wait.
var racyWindow = 2 * time.Second

type noopRecord struct {
	Key string `json:"key"`
	// Files are inputs and outputs (absent ones have size -1); Dirs are the
	// directories whose entries the build read.
	Files   map[string]pathStat `json:"files"`
	Dirs    map[string]pathStat `json:"dirs"`
	Outcome json.RawMessage     `json:"outcome"`
}

// noopEligible says whether a build with these options may be answered
// from a no-op record: not a rebuild, a release or stamped build (their
// stamps read git's tree state), nor one with side effects beside its
// outputs (caches imported, exported or seeded, traced compiles). A rebuild
// may still record one: it wrote the same bytes.
func noopEligible(opts Options, recording bool) bool {
	return (recording || !opts.Rebuild && !opts.TraceCompiles) && !opts.Stamp && !opts.Release &&
		opts.CacheTo == "" && opts.CacheFrom == "" && opts.GoCacheTo == "" && opts.GoCacheFrom == ""
}

// noopResult is what a no-op build returns: the outputs, and the names of
// the steps it would have reused and of those explain tracks.
type noopResult struct {
	Dir     string        `json:"dir,omitempty"`
	Images  []ImageResult `json:"images,omitempty"`
	Steps   []string      `json:"steps"`
	Tracked []string      `json:"tracked,omitempty"`
}

func (r *noopResult) steps() buildkit.Steps {
	var out buildkit.Steps
	for _, name := range r.Steps {
		out = append(out, buildkit.Step{Name: name, Cached: true})
	}
	return out
}

// noopPaths are where one kind of build keeps its record.
func noopPaths(opts Options, kind string) (key, path string, ok bool) {
	kilnRoot, err := opts.root()
	if err != nil {
		return "", "", false
	}
	root := kilnRoot
	if opts.Module != "" {
		if root, err = filepath.Abs(opts.Module); err != nil {
			return "", "", false
		}
	}
	key, ok = noopKey(kind, opts, kilnRoot, root)
	return key, filepath.Join(opts.OutDirFor(root), explainDir, fmt.Sprintf(noopFile, kind)), ok
}

// noopKey names everything a build depends on beside the files it reads:
// kiln's executable (by content), the host go command (go list), the options, the
// environment, the working directory and the commit (source date, labels).
func noopKey(kind string, opts Options, kilnRoot, root string) (string, bool) {
	exe, ok := executableDigest()
	if !ok {
		return "", false
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", false
	}
	st, ok := statFile(gobin)
	if !ok {
		return "", false
	}
	h := sha256.New()
	fmt.Fprintf(h, "kiln no-op 1 %s\nkiln %s\ngo %s %d %d\n", kind, exe, gobin, st.Size, st.ModTime)
	fmt.Fprintf(h, "options %q %q %q %q %q %v %q %q %q %q\n", kilnRoot, root, opts.Platforms, opts.Images, opts.OutDir,
		opts.SkipChecks, opts.Packages, opts.BinaryPlatforms, opts.GoCacheKey, fmt.Sprint(opts.GoCacheMax))
	wd, _ := os.Getwd()
	fmt.Fprintf(h, "wd %s\n", wd)
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		// Set per run by shells and by mage.go; nothing reads them.
		return name == "_" || name == "OLDPWD" || name == "KILN_MAGE_STARTED"
	})
	slices.Sort(env)
	for _, kv := range env {
		fmt.Fprintf(h, "env %s\n", kv)
	}
	head, err := exec.Command("git", "-C", root, "log", "-1", "--format=%H %ct").Output()
	fmt.Fprintf(h, "git %s %v\n", head, err != nil)
	return hex.EncodeToString(h.Sum(nil)), true
}

// noopOutcome returns the recorded outcome of the last build of this kind
// when nothing it read or wrote has changed since, and the explain folder
// the record is in.
func noopOutcome(opts Options, kind string) (*noopResult, string, bool) {
	if !noopEligible(opts, false) {
		return nil, "", false
	}
	key, path, ok := noopPaths(opts, kind)
	if !ok {
		return nil, "", false
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", false
	}
	var rec noopRecord
	if json.Unmarshal(data, &rec) != nil || rec.Key != key {
		return nil, "", false
	}
	for _, set := range []map[string]pathStat{rec.Files, rec.Dirs} {
		for p, want := range set {
			if statPath(p) != want {
				return nil, "", false
			}
		}
	}
	var out noopResult
	if json.Unmarshal(rec.Outcome, &out) != nil {
		return nil, "", false
	}
	return &out, filepath.Dir(path), true
}

// pathStat is how a file or directory looked: its size, modification
// time and, where the system has them, its inode and change time, which no
// tool sets back (an archive extracted with its old times, a copy with
// `cp -p`).
type pathStat struct {
	Size    int64  `json:"s"`
	ModTime int64  `json:"m"`
	Change  int64  `json:"c,omitempty"`
	Inode   uint64 `json:"i,omitempty"`
}

// statPath is a path's pathStat; size -1 when it does not exist.
func statPath(path string) pathStat {
	fi, err := os.Stat(path)
	if err != nil {
		return pathStat{Size: -1}
	}
	st := pathStat{Size: fi.Size(), ModTime: fi.ModTime().UnixNano()}
	st.Change, st.Inode = changeTime(fi)
	return st
}

// noopReads are the files and directories a build of p read, beside what
// go list read: the configuration, the images' files, the sources.
type noopReads struct {
	files, dirs []string
}

func (r *noopReads) tree(dir string) {
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			r.files = append(r.files, path) // recorded as absent or unreadable
			return nil
		}
		if d.IsDir() {
			r.dirs = append(r.dirs, path)
		} else {
			r.files = append(r.files, path)
		}
		return nil
	})
}

// recordNoop writes the record that lets the next identical build return
// outcome at once; began is when this build started. It records nothing
// (and drops an older record) when the options do not allow it, when what
// go list read is unknown, or when an input changed too recently to trust.
func (s *Session) recordNoop(opts Options, kind string, began time.Time, outputs []string, outcome noopResult) {
	key, path, ok := noopPaths(opts, kind)
	if !ok {
		return
	}
	os.Remove(path)
	p := s.Plan
	if !noopEligible(opts, true) || s.sideEffects || p.Reads.Unknown {
		return
	}
	kilnRoot, err := opts.root()
	if err != nil {
		return
	}
	r := &noopReads{
		files: append(slices.Clone(p.Reads.Files), filepath.Join(kilnRoot, config.File), filepath.Join(p.Root, ".dockerignore")),
		dirs:  append(slices.Clone(p.Reads.Dirs), kilnRoot, p.Root, filepath.Dir(filepath.Join(kilnRoot, config.File))),
	}
	if env, err := plan.GoEnvFile(); err == nil {
		r.files = append(r.files, env)
	}
	r.tree(filepath.Join(kilnRoot, config.ImagesDir))
	for _, b := range p.Binaries {
		for _, f := range b.Files {
			r.files = append(r.files, filepath.Join(p.Root, filepath.FromSlash(f)))
		}
	}
	for _, img := range p.Images {
		for _, f := range img.Files {
			r.tree(filepath.Join(p.Root, filepath.FromSlash(img.Dir), filepath.FromSlash(f.Src)))
		}
	}
	rec := noopRecord{Key: key, Files: map[string]pathStat{}, Dirs: map[string]pathStat{}}
	trusted := began.Add(-racyWindow).UnixNano()
	for _, set := range []struct {
		paths []string
		into  map[string]pathStat
	}{{r.files, rec.Files}, {r.dirs, rec.Dirs}} {
		for _, p := range set.paths {
			st := statPath(p)
			if max(st.ModTime, st.Change) > trusted {
				return
			}
			set.into[p] = st
		}
	}
	for _, f := range outputs {
		if rec.Files[f] = statPath(f); rec.Files[f].Size < 0 {
			return
		}
	}
	if rec.Outcome, err = json.Marshal(outcome); err != nil {
		return
	}
	buildkit.WriteAtomic(path, func(w io.Writer) error { return json.NewEncoder(w).Encode(rec) })
}

// images is a no-op images build's outcome: every image kept, every step
// reused, the checks passed when they last ran on these images. explain
// is told the last build reused every step.
func (r *noopResult) images(opts Options, explainIn string) (*ImagesOutcome, error) {
	out := &ImagesOutcome{Steps: r.steps()}
	for _, img := range r.Images {
		img.Kept = true
		out.Images = append(out.Images, img)
	}
	if !opts.SkipChecks {
		out.Checks = &verify.Report{}
	}
	for _, name := range r.Tracked {
		out.Explanations = append(out.Explanations, explain.Explanation{Step: name})
	}
	if err := buildkit.WriteAtomic(filepath.Join(explainIn, noopMarker), func(io.Writer) error { return nil }); err != nil {
		return nil, err
	}
	return out, nil
}
