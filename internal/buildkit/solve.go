package buildkit

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	gofs "io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moby/buildkit/client"
	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/exporter/containerimage/exptypes"
	gateway "github.com/moby/buildkit/frontend/gateway/client"
	gatewaypb "github.com/moby/buildkit/frontend/gateway/pb"
	"github.com/moby/buildkit/session"
	"github.com/moby/buildkit/util/progress/progressui"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/tonistiigi/fsutil"
	fstypes "github.com/tonistiigi/fsutil/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kiln-build/kiln/internal/atomicfile"
	"github.com/kiln-build/kiln/internal/uptodate"
)

// Job is one solve: a gateway build function and where its result goes.
type Job struct {
	Name  string
	Build gateway.BuildFunc
	// FrontendAttrs tell BuildKit what was asked for, e.g. "platform".
	FrontendAttrs map[string]string
	// Export is the exporter; for file outputs Output is set by Solve. An
	// empty Type exports nothing (a job solved for its layer cache only).
	Export client.ExportEntry
	// Dest is the final path of the output (a file for tar exporters, a
	// directory for the local exporter and Fetch). It appears only when the solve
	// succeeded; until then the output has a temporary name. Empty for
	// exporters that write nowhere on this machine (a registry push).
	Dest string
	// Complete, when set, adds to a directory export what the solve left
	// out (files the old output already holds), before it replaces Dest.
	Complete func(dir string) error
	// Fetch, when set, is the job's build and its exporter: it solves
	// through c and writes the output into dir, a new directory that
	// replaces Dest (after Complete) when every job succeeded; Build and
	// Export are then unused. The result it returns (nil for none) is what
	// a layer cache export holds. Files read through the gateway reach this
	// machine faster than through the local exporter, whose file sync runs
	// gRPC inside gRPC. send adds to the progress display.
	Fetch func(ctx context.Context, c gateway.Client, dir string, send func(*client.SolveStatus)) (*gateway.Result, error)
}

// Result is what one job produced.
type Result struct {
	Name   string
	Dest   string
	Digest string
}

// Step is one vertex of a solve, as the status stream reported it.
type Step struct {
	Name     string        `json:"name"`
	Cached   bool          `json:"cached"`
	Duration time.Duration `json:"duration"`
	// Runs counts the jobs of the solve that executed the step.
	Runs int `json:"runs,omitempty"`
}

// Outcome is what one Solve did: each job's result and every step.
type Outcome struct {
	Results []Result
	Steps   Steps
}

// Steps are the named vertices of a solve in the order first reported.
type Steps []Step

// Ran returns the names of the steps that ran (were not reused) and whose
// name contains substr.
func (s Steps) Ran(substr string) []string {
	var names []string
	for _, st := range s {
		if !st.Cached && strings.Contains(st.Name, substr) {
			names = append(names, st.Name)
		}
	}
	return names
}

// Plus is s followed by the steps of a later solve: a step of both ran in
// the jobs of either, was reused only if both reused it, and took the
// longer of its two times.
func (s Steps) Plus(later Steps) Steps {
	out := slices.Clone(s)
	at := map[string]int{}
	for i, st := range out {
		at[st.Name] = i
	}
	for _, st := range later {
		i, ok := at[st.Name]
		if !ok {
			at[st.Name] = len(out)
			out = append(out, st)
			continue
		}
		out[i].Runs += st.Runs
		out[i].Cached = out[i].Cached && st.Cached
		out[i].Duration = max(out[i].Duration, st.Duration)
	}
	return out
}

// SolveOptions apply to every job of one Solve.
type SolveOptions struct {
	// Locals maps local source names to directories on this machine.
	Locals map[string]string
	// Mounts maps more local source names to file systems of their own.
	Mounts map[string]fsutil.FS
	// Progress is a progressui mode: auto, tty, plain, quiet or rawjson.
	Progress string
	// Out receives the progress display; os.Stderr when nil.
	Out io.Writer
	// Session holds attachables such as the registry auth provider.
	Session []session.Attachable
	// CacheExports and CacheImports are BuildKit layer caches.
	CacheExports, CacheImports []client.CacheOptionsEntry
	// Hint, when set, adds a remedy to a failed step's output ("" for none).
	Hint func(output string) string
	// Check, when set, judges the outputs before any replaces the one in
	// place: at maps each job's Dest to where its output is now (a
	// temporary name, or Dest itself when the one in place was kept). An
	// error leaves every output in place as it was.
	Check func(results []Result, at map[string]string) error
	// Marshal, when set, makes a job's definitions, and Solved notes those
	// it solved: an isolated build's make every step it has not run yet
	// ignore the cache (image.Graph.Marshal).
	Marshal func(context.Context, llb.State) (*llb.Definition, error)
	Solved  func(*llb.Definition)
}

// MarshalState is st's definition, made by opts.Marshal when set.
func (opts SolveOptions) MarshalState(ctx context.Context, st llb.State) (*llb.Definition, error) {
	if opts.Marshal != nil {
		return opts.Marshal(ctx, st)
	}
	return st.Marshal(ctx)
}

// ProgressModes are the accepted values of -progress and KILN_PROGRESS.
var ProgressModes = []string{"auto", "tty", "plain", "quiet", "rawjson"}

// Solve runs the jobs one after another on the daemon with one progress
// display.
// Outputs are renamed into place only when every job succeeded.
func (d *Daemon) Solve(ctx context.Context, jobs []Job, opts SolveOptions) (*Outcome, error) {
	out := opts.Out
	if out == nil {
		out = os.Stderr
	}
	mode := opts.Progress
	if mode == "" {
		mode = "auto"
	}
	display, err := progressui.NewDisplay(out, progressui.DisplayMode(mode))
	if err != nil {
		return nil, fmt.Errorf("progress %q: %w (use one of %s)", mode, err, strings.Join(ProgressModes, ", "))
	}
	mounts := map[string]fsutil.FS{}
	for name, dir := range opts.Locals {
		fs, err := fsutil.NewFS(dir)
		if err != nil {
			return nil, fmt.Errorf("local source %s (%s): %w", name, dir, err)
		}
		mounts[name] = sameForEveryoneFS{fs, dir}
	}
	for name, fs := range opts.Mounts {
		root := ""
		if r, ok := fs.(RootedFS); ok {
			root = r.Root()
		}
		mounts[name] = sameForEveryoneFS{fs, root}
	}

	statusCh := make(chan *client.SolveStatus)
	logs := newVertexLogs()
	displayDone := make(chan struct{})
	var beat *heartbeat
	if plainDisplay(out, mode) {
		beat = newHeartbeat(out, time.Now())
		go beat.run(displayDone)
	}
	go func() {
		defer close(displayDone)
		display.UpdateFrom(context.WithoutCancel(ctx), statusCh)
	}()

	var temps []string
	cleanup := func() {
		for _, t := range temps {
			if t != "" {
				os.RemoveAll(t)
			}
		}
	}
	results := make([]Result, len(jobs))
	unchanged := make([]bool, len(jobs))
	var fwd sync.WaitGroup
	// Jobs run one after another. Concurrent sessions syncing the same local
	// sources into one shared snapshot were seen, rarely, to give a step a
	// source tree without go.mod; the jobs share most steps, so running them
	// in turn costs little.
	var runs []func() error
	for i, job := range jobs {
		exp := job.Export
		tmp := ""
		if job.Fetch != nil {
			exp = client.ExportEntry{}
		}
		if job.Dest != "" {
			if tmp, err = atomicfile.Temp(job.Dest, exp.Type == client.ExporterLocal || job.Fetch != nil); err != nil {
				cleanup()
				close(statusCh)
				<-displayDone
				return nil, err
			}
			temps = append(temps, tmp)
			if exp.Type == client.ExporterLocal {
				exp.OutputDir = tmp
			} else if exp.Type != "" {
				exp.Output = func(md map[string]string) (io.WriteCloser, error) {
					// A build that exports the image it exported last time
					// (a -rebuild, a lost record) keeps the tarball when
					// it is intact: the daemon skips sending it when told
					// so.
					if dg := md[exptypes.ExporterImageDigestKey]; dg != "" && dg == intactLayoutDigest(job.Dest) {
						unchanged[i] = true
						return alreadyExported{}, nil
					}
					return os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
				}
			}
		} else {
			temps = append(temps, "")
		}
		runs = append(runs, func() error {
			ch := make(chan *client.SolveStatus) // closed by Build
			fwd.Add(1)
			go func() {
				defer fwd.Done()
				for s := range ch {
					logs.record(i, s)
					if beat != nil {
						beat.saw(s, time.Now())
					}
					statusCh <- s
				}
			}()
			// The client library copies cache-import attributes into this map
			// and panics on a nil one.
			attrs := map[string]string{}
			maps.Copy(attrs, job.FrontendAttrs)
			var exports []client.ExportEntry
			if exp.Type != "" {
				exports = []client.ExportEntry{exp}
			}
			build := job.Build
			if job.Fetch != nil {
				dir := tmp
				build = func(ctx context.Context, c gateway.Client) (*gateway.Result, error) {
					// ch is closed only after this returns.
					res, err := job.Fetch(ctx, c, dir, func(s *client.SolveStatus) { ch <- s })
					if err != nil {
						return nil, err
					}
					if res == nil {
						res = gateway.NewResult()
					}
					return res, nil
				}
			}
			resp, err := d.Build(ctx, client.SolveOpt{
				Exports:       exports,
				LocalMounts:   mounts,
				SharedKey:     "kiln",
				FrontendAttrs: attrs,
				Session:       opts.Session,
				CacheExports:  perJob(opts.CacheExports, job.Name),
				CacheImports:  opts.CacheImports,
			}, "kiln", build, ch)
			if err != nil {
				return fmt.Errorf("%s: %w", job.Name, err)
			}
			results[i] = Result{Name: job.Name, Dest: job.Dest, Digest: resp.ExporterResponse["containerimage.digest"]}
			return nil
		})
	}
	err = nil
	for _, run := range runs {
		if err = run(); err != nil {
			break
		}
	}
	fwd.Wait()
	close(statusCh)
	<-displayDone
	if err != nil {
		cleanup()
		return nil, d.explain(ctx, err, logs, opts.Hint)
	}
	at := map[string]string{}
	for i, job := range jobs {
		if job.Dest == "" {
			continue
		}
		at[job.Dest] = temps[i]
		if unchanged[i] {
			at[job.Dest] = job.Dest
			continue
		}
		if job.Complete != nil {
			if err := job.Complete(temps[i]); err != nil {
				cleanup()
				return nil, err
			}
		}
	}
	if opts.Check != nil {
		if err := opts.Check(results, at); err != nil {
			cleanup()
			return nil, err
		}
	}
	for i, job := range jobs {
		if job.Dest == "" {
			continue
		}
		if unchanged[i] {
			os.RemoveAll(temps[i])
			continue
		}
		if err := atomicfile.Replace(temps[i], job.Dest); err != nil {
			cleanup()
			return nil, err
		}
	}
	return &Outcome{Results: results, Steps: logs.steps()}, nil
}

// RootedFS is a local source whose files lie under a folder of this
// machine, which Root names.
type RootedFS interface {
	fsutil.FS
	Root() string
}

// sameForEveryoneFS sends each file with the owner and permissions git
// would check it out with: root; 0755 or 0644 by its owner's execute bit;
// links 0777; no extended attributes. BuildKit keys every step on the
// content hash of its local sources, which includes owner, mode and
// extended attributes, so two users' checkouts of one commit (another uid,
// umask 002 against 022) would otherwise share no layer cache. Walk errors
// pass through untouched, for the session's own filter to judge.
//
// A regular file under root is sent with its change time as modification
// time when that is later: BuildKit's file sync sends a file again only
// when its size or modification time differ, so a rewrite that kept both
// (cp -p, touch -r, a restore keeping times) would leave the old bytes in
// the daemon while kiln, which reads the change time, builds anew. The
// content hash BuildKit keys steps on leaves the modification time out.
type sameForEveryoneFS struct {
	fsutil.FS
	root string
}

func (f sameForEveryoneFS) Walk(ctx context.Context, target string, fn gofs.WalkDirFunc) error {
	return f.FS.Walk(ctx, target, func(path string, entry gofs.DirEntry, err error) error {
		if err == nil && entry != nil {
			// Info gives a copy of the stat; the sender reads the entry's.
			if fi, infoErr := entry.Info(); infoErr == nil {
				if st, ok := fi.Sys().(*fstypes.Stat); ok {
					sameForEveryone(st)
					if f.root != "" && os.FileMode(st.Mode).IsRegular() {
						if now, ok := uptodate.StatPath(filepath.Join(f.root, filepath.FromSlash(path))); ok && now.Change > st.ModTime {
							st.ModTime = now.Change
						}
					}
					entry = &fsutil.DirEntryInfo{Stat: st}
				}
			}
		}
		return fn(path, entry, err)
	})
}

func sameForEveryone(st *fstypes.Stat) {
	st.Uid, st.Gid, st.Xattrs = 0, 0, nil
	mode := os.FileMode(st.Mode)
	switch {
	case mode&os.ModeSymlink != 0:
		mode = os.ModeSymlink | 0o777
	case mode.IsDir(), mode.IsRegular() && mode&0o100 != 0:
		mode = mode.Type() | 0o755
	case mode.IsRegular():
		mode = 0o644
	}
	st.Mode = uint32(mode)
}

// perJob gives each job's registry cache export a tag of its own
// (<ref>-<job>), so concurrent jobs do not overwrite each other's cache.
func perJob(exports []client.CacheOptionsEntry, job string) []client.CacheOptionsEntry {
	var out []client.CacheOptionsEntry
	for _, e := range exports {
		attrs := map[string]string{}
		for k, v := range e.Attrs {
			attrs[k] = v
		}
		if ref := attrs["ref"]; e.Type == "registry" && ref != "" {
			attrs["ref"] = JobCacheRef(ref, job)
		}
		out = append(out, client.CacheOptionsEntry{Type: e.Type, Attrs: attrs})
	}
	return out
}

// JobCacheRef is the registry cache reference one job exports to.
func JobCacheRef(ref, job string) string {
	slash := strings.LastIndex(ref, "/")
	if colon := strings.LastIndex(ref, ":"); colon > slash {
		return ref + "-" + job
	}
	return ref + ":" + job
}

// explain turns a solve error into one message: a vanished daemon is named as
// such, and a failed step shows its own output, not the whole build's.
func (d *Daemon) explain(ctx context.Context, err error, logs *vertexLogs, hint func(string) string) error {
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return fmt.Errorf("build interrupted: %w", ctx.Err())
	}
	if d.Managed != nil {
		pid, ok := d.Managed.PID()
		// The connection can drop before the killed process is gone.
		for i := 0; ok && atomicfile.Alive(pid) && i < 40; i++ {
			time.Sleep(50 * time.Millisecond)
		}
		if ok && !atomicfile.Alive(pid) {
			return fmt.Errorf("the managed buildkitd (pid %d) died during the build; the next run restarts it\n%s", pid, Tail(d.Managed.LogFile(), 10))
		}
	}
	if name, output := logs.failed(); name != "" {
		if hint != nil {
			output += hint(output)
		}
		return &StepError{Name: name, Output: output, Err: err}
	}
	return err
}

// StepError is a step of the graph that failed, with its output, and
// BuildKit's error under it.
type StepError struct {
	Name, Output string
	Err          error
}

func (e *StepError) Error() string { return fmt.Sprintf("%s failed:\n%s", e.Name, e.Output) }

func (e *StepError) Unwrap() error { return e.Err }

// BuildFailed says err is a step whose process exited with an error of its
// own (a compile error): the build's failure, which another daemon would
// repeat. The step's process killed by a signal (exit status above 128) or
// whose status is unknown is not. A compiler the kernel killed for memory
// counts as the build's: go reports it as its own exit status 1.
func BuildFailed(err error) bool {
	var exit *gatewaypb.ExitError
	return errors.As(err, &exit) && exit.ExitCode > 0 && exit.ExitCode <= 128
}

// vertexLogs keeps each vertex's name and output, to show a failure's own.
type vertexLogs struct {
	mu       sync.Mutex
	vertices map[digest.Digest]*client.Vertex
	seen     []digest.Digest
	// ran marks vertices that executed in some job; a later job of the same
	// Solve reports the same vertex as cached.
	ran map[digest.Digest]bool
	// ranIn says, by job, whether the last completion of a vertex that job
	// reported was not from the cache: a step a later job ran again counts
	// twice. (For a vertex without inputs BuildKit reports a short
	// completion, not marked cached, before it loads a cached result.)
	ranIn  map[digest.Digest]map[int]bool
	names  map[digest.Digest]string
	errs   map[digest.Digest]string
	output map[digest.Digest][]byte
	order  []digest.Digest
}

func newVertexLogs() *vertexLogs {
	return &vertexLogs{vertices: map[digest.Digest]*client.Vertex{}, ran: map[digest.Digest]bool{}, ranIn: map[digest.Digest]map[int]bool{}, names: map[digest.Digest]string{}, errs: map[digest.Digest]string{}, output: map[digest.Digest][]byte{}}
}

const maxLogPerVertex = 64 << 10

func (v *vertexLogs) record(job int, s *client.SolveStatus) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, vx := range s.Vertexes {
		if _, ok := v.vertices[vx.Digest]; !ok {
			v.seen = append(v.seen, vx.Digest)
		}
		v.vertices[vx.Digest] = vx
		if !vx.Cached && vx.Completed != nil {
			v.ran[vx.Digest] = true
		}
		if vx.Completed != nil {
			if v.ranIn[vx.Digest] == nil {
				v.ranIn[vx.Digest] = map[int]bool{}
			}
			v.ranIn[vx.Digest][job] = !vx.Cached
		}
		v.names[vx.Digest] = vx.Name
		// A missing cache to import is a warning, not the build's failure.
		if vx.Error != "" && !strings.Contains(vx.Error, "context canceled") && !strings.HasPrefix(vx.Name, "importing cache manifest") {
			if _, seen := v.errs[vx.Digest]; !seen {
				v.order = append(v.order, vx.Digest)
			}
			v.errs[vx.Digest] = vx.Error
		}
	}
	for _, l := range s.Logs {
		if len(v.output[l.Vertex]) < maxLogPerVertex {
			v.output[l.Vertex] = append(v.output[l.Vertex], l.Data...)
		}
	}
}

// steps lists the named vertices with whether they were reused.
func (v *vertexLogs) steps() Steps {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out Steps
	for _, dg := range v.seen {
		vx := v.vertices[dg]
		if vx.Name == "" || !strings.HasPrefix(vx.Name, "[") {
			continue // kiln names its vertices "[what] step"; skip BuildKit's own
		}
		st := Step{Name: vx.Name, Cached: !v.ran[dg]}
		for _, ran := range v.ranIn[dg] {
			if ran {
				st.Runs++
			}
		}
		if vx.Started != nil && vx.Completed != nil {
			st.Duration = vx.Completed.Sub(*vx.Started)
		}
		out = append(out, st)
	}
	return out
}

// failed returns the first failed vertex's name with its output and error.
func (v *vertexLogs) failed() (string, string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.order) == 0 {
		return "", ""
	}
	dg := v.order[0]
	out := strings.TrimRight(string(v.output[dg]), "\n")
	if out != "" {
		out += "\n"
	}
	return v.names[dg], out + v.errs[dg]
}

// alreadyExported answers the daemon's tarball stream with AlreadyExists,
// which BuildKit's OCI exporter takes as success without sending the image.
type alreadyExported struct{}

func (alreadyExported) Write([]byte) (int, error) {
	return 0, status.Error(codes.AlreadyExists, "the image is in place already")
}

func (alreadyExported) Close() error {
	return status.Error(codes.AlreadyExists, "the image is in place already")
}

// intactLayoutDigest is the index digest of an OCI layout tarball whose
// every blob holds the bytes its name says and whose every blob the index
// reaches is there; "" otherwise (no file, not a layout, a flipped byte,
// a blob missing). Only such a tarball may stand for the export.
func intactLayoutDigest(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	seen := map[digest.Digest]bool{}
	small := map[digest.Digest][]byte{} // the index and manifests, to follow
	var index ocispec.Index
	indexed := false
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return ""
		}
		name := strings.TrimPrefix(h.Name, "./")
		switch {
		case name == "index.json":
			if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(&index); err != nil || len(index.Manifests) != 1 {
				return ""
			}
			indexed = true
		case strings.HasPrefix(name, "blobs/sha256/") && h.Typeflag == tar.TypeReg:
			want := digest.NewDigestFromEncoded(digest.SHA256, strings.TrimPrefix(name, "blobs/sha256/"))
			if want.Validate() != nil {
				return ""
			}
			verifier := want.Verifier()
			var keep bytes.Buffer
			w := io.Writer(verifier)
			if h.Size <= 1<<20 {
				w = io.MultiWriter(verifier, &keep)
			}
			if _, err := io.Copy(w, tr); err != nil || !verifier.Verified() {
				return ""
			}
			seen[want] = true
			if h.Size <= 1<<20 {
				small[want] = keep.Bytes()
			}
		}
	}
	if !indexed {
		return ""
	}
	// Every blob the index reaches, through image indexes and manifests.
	queue := []digest.Digest{index.Manifests[0].Digest}
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		if !seen[d] {
			return ""
		}
		var node struct {
			Manifests []ocispec.Descriptor `json:"manifests"`
			Config    *ocispec.Descriptor  `json:"config"`
			Layers    []ocispec.Descriptor `json:"layers"`
		}
		data, ok := small[d]
		if !ok || json.Unmarshal(data, &node) != nil {
			continue // a layer, or a blob too large to be a manifest
		}
		for _, m := range append(node.Manifests, node.Layers...) {
			queue = append(queue, m.Digest)
		}
		if node.Config != nil {
			queue = append(queue, node.Config.Digest)
		}
	}
	return index.Manifests[0].Digest.String()
}

// Together is an empty state that depends on every one of states without
// copying from them: solving it runs their steps side by side, in one solve.
func Together(name string, states ...llb.State) llb.State {
	none := &llb.CopyInfo{AllowWildcard: true, AllowEmptyWildcard: true}
	var fa *llb.FileAction
	for _, st := range states {
		if fa == nil {
			fa = llb.Copy(st, "/.kiln-nothing-*", "/", none)
		} else {
			fa = fa.Copy(st, "/.kiln-nothing-*", "/", none)
		}
	}
	return llb.Scratch().File(fa, llb.WithCustomName(name))
}
