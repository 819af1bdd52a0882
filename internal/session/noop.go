package session

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/explain"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/uptodate"
	"github.com/kiln-build/kiln/internal/verify/inspect"
)

// A no-op build is answered before the plan is resolved or BuildKit is
// contacted. While a build runs, kiln takes the stat (size, modification
// and change time, inode) of every file and directory it reads: the
// configuration and the key files it names, what go list read (module
// files, each package directory and its files), the binaries' sources, the
// images' files; after it, of the outputs it wrote. The next build with the
// same kiln executable, flags, environment and git commit whose files all stat
// the same is the same build: it returns the recorded outcome, as make and
// git's index trust a stat. A directory's modification time changes when
// an entry is added, removed or renamed; the change time, when anything
// (even a tool that sets the modification time back) writes. An input
// changed less than uptodate.RacyWindow before the build began, by the clock of the
// file system, could change again without a visible stat change, so such a
// build records nothing, as git treats "racily clean" entries.
const noopFile = "no-op-%s.json"

type noopRecord struct {
	Key string `json:"key"`
	// Files are inputs and outputs (absent ones have size -1); Dirs are the
	// directories whose entries the build read.
	Files   map[string]uptodate.Stat `json:"files"`
	Dirs    map[string]uptodate.Stat `json:"dirs"`
	Outcome json.RawMessage          `json:"outcome"`
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

// noopPlace is where one kind of build keeps its record, with the roots
// it reads: kiln's (configuration) and the plan's (-module's, else kiln's).
type noopPlace struct{ kilnRoot, root, path string }

func noopPlaceOf(opts Options, kind string) (noopPlace, bool) {
	kilnRoot, err := opts.RootDir()
	if err != nil {
		return noopPlace{}, false
	}
	root := kilnRoot
	if opts.Module != "" {
		if root, err = filepath.Abs(opts.Module); err != nil {
			return noopPlace{}, false
		}
	}
	return noopPlace{kilnRoot, root, filepath.Join(opts.OutDirFor(root), explainDir, fmt.Sprintf(noopFile, kind))}, true
}

// startNoop drops the record of the last build of this kind (this build
// replaces its outputs, or fails) and notes when this one began.
func startNoop(opts Options, kind string) uptodate.Clock {
	place, ok := noopPlaceOf(opts, kind)
	if !ok {
		return uptodate.Clock{}
	}
	if err := os.Remove(place.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return uptodate.Clock{}
	}
	return uptodate.FileSystemClock(filepath.Dir(place.path))
}

// sessionStart is when a session began, by the same clock as startNoop's,
// for a session that records no no-op (size, a release, verify:repro) or
// whose record could not be dropped: the vendor archive's racy window and
// the source digests' record go by it.
func sessionStart(opts Options) uptodate.Clock {
	place, ok := noopPlaceOf(opts, "session")
	if !ok {
		return uptodate.Clock{At: time.Now(), OK: true}
	}
	return uptodate.FileSystemClock(filepath.Dir(place.path))
}

// headOf reads the git head of the tree opts build, once a build: the
// no-op key and the plan both take it.
func headOf(opts Options) *plan.Git {
	place, ok := noopPlaceOf(opts, "")
	if !ok {
		return nil
	}
	head := plan.ReadGitHead(place.root)
	return &head
}

// noopKey names everything a build depends on beside the files it reads:
// kiln's executable (by content), the host go command (go env, and go list
// where the pinned toolchain cannot list), the options, the
// environment, the working directory and the commit (source date, labels).
func noopKey(kind string, opts Options, kilnRoot, root string, head *plan.Git) (string, bool) {
	exe, ok := uptodate.ExecutableDigest()
	if !ok {
		return "", false
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", false
	}
	st, ok := uptodate.StatFile(gobin)
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
	if head == nil {
		return "", false
	}
	fmt.Fprintf(h, "git %s\n", head.Key())
	return hex.EncodeToString(h.Sum(nil)), true
}

// noopOutcome returns the recorded outcome of the last build of this kind
// when nothing it read or wrote has changed since, and the explain folder
// the record is in.
func noopOutcome(opts Options, kind string, head *plan.Git) (*noopResult, string, bool) {
	if !noopEligible(opts, false) {
		return nil, "", false
	}
	if _, err := opts.ProgressMode(); err != nil {
		return nil, "", false // the build names the error
	}
	place, ok := noopPlaceOf(opts, kind)
	if !ok {
		return nil, "", false
	}
	data, err := os.ReadFile(place.path)
	if err != nil {
		return nil, "", false
	}
	key, ok := noopKey(kind, opts, place.kilnRoot, place.root, head)
	if !ok {
		return nil, "", false
	}
	var rec noopRecord
	if json.Unmarshal(data, &rec) != nil || rec.Key != key {
		return nil, "", false
	}
	for _, set := range []map[string]uptodate.Stat{rec.Files, rec.Dirs} {
		for p, want := range set {
			if st, _ := uptodate.StatPath(p); st != want {
				return nil, "", false
			}
		}
	}
	var out noopResult
	if json.Unmarshal(rec.Outcome, &out) != nil {
		return nil, "", false
	}
	return &out, filepath.Dir(place.path), true
}

// noopReads are the files and directories a build of p read, beside what
// go list read: the configuration, the images' files, the sources.
type noopReads struct {
	files, dirs []string
}

func (r *noopReads) tree(dir string) {
	if resolved, err := filepath.EvalSymlinks(dir); err == nil && resolved != dir {
		r.files = append(r.files, dir) // the link itself
		dir = resolved
	}
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

// noopInputs are the stats of a build's inputs, taken while its solve runs
// (tens of milliseconds on a large tree). A stat taken before the daemon
// reads a file errs the safe way: a change after it shows next time.
type noopInputs struct {
	done chan struct{}
	path string
	rec  *noopRecord // nil: nothing is recorded
}

// statNoopInputs starts taking the stats recordNoop records, when the
// options allow a record, what go list read is known, and no input changed
// too recently to trust (at or after the build began, less the racy
// window). wait waits for it, so that no stat outlives the build.
func (s *Session) statNoopInputs(opts Options, kind string, head *plan.Git) *noopInputs {
	in := &noopInputs{done: make(chan struct{})}
	start := s.began
	if !start.OK || !noopEligible(opts, true) || s.sideEffects || s.Plan.Reads.Unknown {
		close(in.done)
		return in
	}
	trusted := start.At.Add(-uptodate.RacyWindow).UnixNano()
	go func() {
		defer close(in.done)
		in.path, in.rec = s.noopInputRecord(opts, kind, trusted, head)
	}()
	return in
}

func (in *noopInputs) wait() { <-in.done }

// changed says whether an input no longer stats as it did when the record
// took it; it waits for the stats.
func (in *noopInputs) changed() bool {
	in.wait()
	if in.rec == nil {
		return false
	}
	for _, set := range []map[string]uptodate.Stat{in.rec.Files, in.rec.Dirs} {
		for p, want := range set {
			if st, _ := uptodate.StatPath(p); st != want {
				return true
			}
		}
	}
	return false
}

// noopInputRecord stats the inputs; none may have changed after trusted.
func (s *Session) noopInputRecord(opts Options, kind string, trusted int64, head *plan.Git) (string, *noopRecord) {
	p := s.Plan
	place, ok := noopPlaceOf(opts, kind)
	if !ok {
		return "", nil
	}
	key, ok := noopKey(kind, opts, place.kilnRoot, place.root, head)
	if !ok {
		return "", nil
	}
	r := &noopReads{
		files: append(slices.Clone(p.Reads.Files), filepath.Join(place.kilnRoot, config.File), filepath.Join(p.Root, ".dockerignore")),
		dirs:  append(slices.Clone(p.Reads.Dirs), place.kilnRoot, p.Root, filepath.Dir(filepath.Join(place.kilnRoot, config.File))),
	}
	if env, err := plan.GoEnvFile(); err == nil {
		r.files = append(r.files, env)
	}
	// Key files the configuration or a flag names, checked on every build.
	for _, f := range []string{p.Cache.GoCacheKey, opts.GoCacheKey} {
		if f != "" && !filepath.IsAbs(f) {
			f = filepath.Join(place.kilnRoot, f)
		}
		if f != "" {
			r.files = append(r.files, f)
		}
	}
	// A workspace member's go.sum that appears is read by the download step.
	for _, f := range p.ModFiles {
		r.dirs = append(r.dirs, filepath.Dir(filepath.Join(p.Root, filepath.FromSlash(f))))
	}
	r.tree(filepath.Join(place.kilnRoot, config.ImagesDir))
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
	rec := noopRecord{Key: key, Files: map[string]uptodate.Stat{}, Dirs: map[string]uptodate.Stat{}}
	for _, set := range []struct {
		paths []string
		into  map[string]uptodate.Stat
	}{{r.files, rec.Files}, {r.dirs, rec.Dirs}} {
		for _, path := range set.paths {
			st, ok := uptodate.StatPath(path)
			if !ok || max(st.ModTime, st.Change) > trusted {
				return "", nil
			}
			set.into[path] = st
		}
	}
	return place.path, &rec
}

// recordNoop writes the record that lets the next identical build return
// outcome at once, from the inputs' stats. It records nothing when they
// are not to be recorded, when the build had side effects, or when an
// output is no longer what this build wrote or found (another build
// replaced it).
func (s *Session) recordNoop(in *noopInputs, outputs []string, outcome noopResult) {
	in.wait()
	rec := in.rec
	if rec == nil || s.sideEffects || s.readChanged {
		return
	}
	for _, f := range outputs {
		st, _ := uptodate.StatPath(f)
		if want, ok := s.outputs[f]; !ok || st.Size != want.Size || st.ModTime != want.ModTime {
			return
		}
		rec.Files[f] = st
	}
	var err error
	if rec.Outcome, err = json.Marshal(outcome); err != nil {
		return
	}
	atomicfile.Write(in.path, func(w io.Writer) error { return json.NewEncoder(w).Encode(rec) })
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
		out.Checks = &inspect.Report{}
	}
	for _, name := range r.Tracked {
		out.Explanations = append(out.Explanations, explain.Explanation{Step: name})
	}
	if err := atomicfile.Write(filepath.Join(explainIn, explain.NoopMarker), func(io.Writer) error { return nil }); err != nil {
		return nil, err
	}
	return out, nil
}
