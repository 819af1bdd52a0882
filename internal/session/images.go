package session

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/buildkit/client"

	"github.com/kiln-build/kiln/internal/buildkit"
	"github.com/kiln-build/kiln/internal/explain"
	"github.com/kiln-build/kiln/internal/gocache"
	"github.com/kiln-build/kiln/internal/image"
	"github.com/kiln-build/kiln/internal/plan"
	"github.com/kiln-build/kiln/internal/uptodate"
	"github.com/kiln-build/kiln/internal/verify/inspect"
)

// ImageResult is one exported image.
type ImageResult struct {
	Name      string   `json:"name"`
	Ref       string   `json:"ref"`
	Digest    string   `json:"digest"`
	Path      string   `json:"path"`
	Platforms []string `json:"platforms"`
	// Kept is true when the tarball written before was made from the same
	// inputs, so the image was neither built nor exported.
	Kept bool `json:"kept,omitempty"`
	// Manifests are the platform manifests of the index, when asked for
	// (WithManifests).
	Manifests []inspect.PlatformDigest `json:"manifests,omitempty"`
}

// WithManifests reads each image's platform manifests from its tarball.
func (o *ImagesOutcome) WithManifests() error {
	for i, r := range o.Images {
		m, err := inspect.IndexManifests(r.Path)
		if err != nil {
			return err
		}
		o.Images[i].Manifests = m
	}
	return nil
}

// ImagesOutcome is what Images built and which steps ran.
type ImagesOutcome struct {
	Images []ImageResult
	buildkit.Steps
	// Checks are the quick checks run on the new images.
	Checks *inspect.Report
	// Explanations say which steps ran and why.
	Explanations []explain.Explanation
	// GoCache is the Go cache snapshot published, when asked for.
	GoCache *gocache.Result
	// Sources (each binary file's digest) and Stamp are what a part of a
	// spread build read (Options.Part), for package spread to compare.
	Sources map[string]string `json:"-"`
	Stamp   plan.Stamp        `json:"-"`
}

// startRecording starts a session for a build of kind that may record a
// no-op: it drops the last record (this build replaces its outputs, or
// fails), starts, and takes its inputs' stats while the solve runs; wait
// for them before the session closes.
func startRecording(ctx context.Context, opts Options, kind string, head *plan.Git) (*Session, *noopInputs, error) {
	// The output folder is made before any stat is taken: made during the
	// solve, it would change the root folder's stat and look like an edit.
	if place, ok := noopPlaceOf(opts, kind); ok {
		os.MkdirAll(filepath.Dir(filepath.Dir(place.path)), 0o755)
	}
	began := startNoop(opts, kind)
	clock := began
	if !clock.OK {
		clock = sessionStart(opts)
	}
	pr, err := prepare(ctx, opts, clock, head)
	if err != nil {
		return nil, nil, err
	}
	s, err := pr.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	s.began = began
	s.noop = s.statNoopInputs(opts, kind, head)
	return s, s.noop, nil
}

// Images builds every planned image and writes each as an OCI layout
// tarball under <out>/images/<name>.oci.tar.
// It builds on one daemon; package spread builds on several.
func Images(ctx context.Context, opts Options) (*ImagesOutcome, error) {
	head := headOf(opts)
	if r, dir, ok := noopOutcome(opts, "images", head); ok {
		return r.images(opts, dir)
	}
	s, noopInputs, err := startRecording(ctx, opts, "images", head)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	defer noopInputs.wait()
	out, err := s.WriteImages(ctx, opts)
	if err != nil {
		return nil, err
	}
	if out.Checks == nil || out.Checks.Failed() == 0 {
		r := noopResult{Images: out.Images}
		var outputs []string
		for _, img := range out.Images {
			outputs = append(outputs, img.Path)
		}
		if !opts.SkipChecks {
			outputs = append(outputs, inspect.CheckedMarker(ImagesDir(opts, s.Plan)))
		}
		for _, st := range out.Steps {
			r.Steps = append(r.Steps, st.Name)
		}
		for _, e := range out.Explanations {
			r.Tracked = append(r.Tracked, e.Step)
		}
		s.recordNoop(noopInputs, outputs, r)
	}
	return out, nil
}

// ImagesDir is where Images writes the images of p.
func ImagesDir(opts Options, p *plan.Plan) string {
	return filepath.Join(opts.OutDirFor(p.Root), "images")
}

// SourceDigests are the digests of the binaries' files this session
// sends, by path: what a part of a spread build read of the tree. A build
// of images reads them once, before its solve; a push reads the tree each
// time.
func (s *Session) SourceDigests() map[string]string {
	hash := func(f string) (string, error) {
		if s.hashes != nil {
			return s.hashes.Hash(f)
		}
		data, err := os.ReadFile(filepath.Join(s.Plan.Root, f))
		return uptodate.Digest(data), err
	}
	digests := map[string]string{}
	for _, b := range s.Plan.Binaries {
		for _, f := range b.Files {
			if d, err := hash(f); err == nil {
				digests[f] = d
			}
		}
	}
	return digests
}

// WriteImages builds every planned image in this session and writes each
// as an OCI layout tarball, as Images does, but records no no-op.
func (s *Session) WriteImages(ctx context.Context, opts Options) (*ImagesOutcome, error) {
	outDir := opts.OutDirFor(s.Plan.Root)
	dir := ImagesDir(opts, s.Plan)
	inputs, err := s.inputs(outDir)
	if err != nil {
		return nil, err
	}
	done := readOutputs(outDir)
	out := &ImagesOutcome{Images: make([]ImageResult, len(s.Plan.Images))}
	if opts.Part {
		out.Stamp, out.Sources = s.Plan.Stamp, s.SourceDigests()
	}
	keys := make([]string, len(s.Plan.Images))
	var jobs []buildkit.Job
	var solved []int
	for i, img := range s.Plan.Images {
		dest := inspect.ImagePath(dir, img.Name)
		out.Images[i] = ImageResult{Name: img.Name, Ref: img.Ref, Path: dest, Platforms: img.PlatformIDs()}
		attrs := s.ExporterAttrs(img.Ref, img.HasBase())
		keys[i], _ = uptodate.OutputKey("image", img.Name, inputs, assembleSteps(img), append(configsOf(s.Plan, img),
			"oci "+fmt.Sprint(attrs), "platforms "+strings.Join(img.PlatformIDs(), ","))...)
		if r, ok := done.Current("image "+img.Name, keys[i]); ok && s.mayReuse(opts) && r.Files[dest] != (uptodate.Stat{}) {
			out.Images[i].Digest, out.Images[i].Kept = r.Digest, true
			s.sawOutputs(r)
			continue
		}
		solved = append(solved, i)
		jobs = append(jobs, buildkit.Job{
			Name:          img.Name,
			Build:         s.Build(img),
			FrontendAttrs: map[string]string{"platform": strings.Join(img.PlatformIDs(), ",")},
			Export:        client.ExportEntry{Type: client.ExporterOCI, Attrs: attrs},
			Dest:          dest,
		})
	}
	// The quick checks judge the new tarballs before they replace the ones
	// in place: a build whose images fail them leaves the last ones.
	checked := false
	quickChecks := func(at func(name string) string, fresh bool) error {
		if opts.SkipChecks {
			return nil
		}
		var digests [][2]string
		for _, img := range out.Images {
			digests = append(digests, [2]string{img.Name, img.Digest})
		}
		report, err := inspect.QuickChecksOnce(s.Plan, dir, at, digests)
		if err != nil {
			return err
		}
		out.Checks, checked = report, true
		if report.Failed() > 0 && fresh {
			return fmt.Errorf("%w\nthe new images were not written: %s holds the last ones", report.Err(), dir)
		}
		if report.Failed() > 0 {
			return fmt.Errorf("%w\n(of the images in %s, up to date)", report.Err(), dir)
		}
		return nil
	}
	if len(jobs) > 0 {
		s.beforeSolve()
		outcome, err := s.solveImages(ctx, jobs, func(results []buildkit.Result, at map[string]string) error {
			for j, r := range results {
				out.Images[solved[j]].Digest = r.Digest
			}
			return quickChecks(func(name string) string {
				if path, ok := at[inspect.ImagePath(dir, name)]; ok {
					return path
				}
				return inspect.ImagePath(dir, name)
			}, true)
		})
		if err != nil {
			return nil, err
		}
		s.afterSolve()
		out.Steps = outcome.Steps
		for j, r := range outcome.Results {
			i := solved[j]
			out.Images[i].Digest, out.Images[i].Path = r.Digest, r.Dest
			s.sawOutputs(done.Set("image "+s.Plan.Images[i].Name, s.recordable(keys[i]), r.Digest, []string{r.Dest}))
		}
		if err := done.Write(); err != nil {
			return nil, err
		}
	}
	s.saveSourceHashes()
	// The steps of images kept as they were are reused, for explain.
	for _, name := range slices.Sorted(maps.Keys(inputs)) {
		if !slices.ContainsFunc(out.Steps, func(st buildkit.Step) bool { return st.Name == name }) {
			out.Steps = append(out.Steps, buildkit.Step{Name: name, Cached: true})
		}
	}
	if !checked {
		if err := quickChecks(inspect.In(dir), false); err != nil {
			return nil, err
		}
	}
	if !opts.SkipChecks {
		marker := inspect.CheckedMarker(dir)
		if st, ok := uptodate.StatFile(marker); ok {
			s.sawOutputs(uptodate.OutputRecord{Files: map[string]uptodate.Stat{marker: st}})
		}
	}
	if out.Explanations, err = record(opts, s.Plan, inputs, out.Steps); err != nil {
		return nil, err
	}
	if s.goCacheTo != "" {
		if out.GoCache, err = s.publishGoCache(ctx, s.goCacheTo, s.goCacheMax); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// recordable is the key to record outputs under: one no build matches when
// a vendored file changed so lately, or an input changed while the daemon
// read it, that the build may not have built what the key names. The
// record stays, for how the files were written.
func (s *Session) recordable(key string) string {
	if s.vendor.ChangedLately() || s.readChanged {
		return "unconfirmed " + key
	}
	return key
}

// mayReuse says whether outputs written by an earlier build with the same
// inputs may stand in for this build's: not when the caller asked for a
// rebuild, when every step must re-run, or when the solve has side effects
// beside the outputs (layer cache and Go cache exports, traced compiles).
// Every build records its outputs' key all the same: the bytes are the same.
func (s *Session) mayReuse(opts Options) bool {
	return !opts.Rebuild && !s.NoCache && !s.Golang.TraceCompiles && len(s.cacheTo) == 0 && s.goCacheTo == ""
}

// inputs are what each tracked step of this build depends on.
func (s *Session) inputs(outDir string) (explain.Inputs, error) {
	defs, err := s.Graph.Definitions()
	if err != nil {
		return nil, err
	}
	s.hashes = s.loading.Take(sourceHashesPath(outDir), s.Plan.Root, s.clock)
	var files []string
	for _, b := range s.Plan.Binaries {
		files = append(files, b.Files...)
	}
	slices.Sort(files)
	s.hashes.Prestat(slices.Compact(files))
	in, err := explain.Collect(s.Plan, defs, s.hashes.Hash)
	s.keyInputs, s.defs = in, defs
	return in, err
}

// saveSourceHashes keeps the digests inputs read, once the build has
// written its outputs: a failed build leaves nothing in the output folder.
func (s *Session) saveSourceHashes() {
	if s.hashes != nil {
		s.hashes.Save()
	}
}

// configsOf are the image's OCI configs as kiln writes them, one per
// platform, for its key: labels (revision, source, version), created time,
// env, entrypoint and user are made at solve time, in no step's
// definition. What the base adds is named by its digest, in image.yaml.
func configsOf(p *plan.Plan, img plan.Image) []string {
	var out []string
	for _, target := range img.Targets {
		data, _ := json.Marshal(image.Config(p, img, target, nil))
		out = append(out, "config "+string(data))
	}
	return out
}

// assembleSteps are the steps that put an image together, one per platform;
// their inputs hold those of every binary in the image.
func assembleSteps(img plan.Image) []string {
	var steps []string
	for _, target := range img.Targets {
		steps = append(steps, image.AssembleStepName(img.Name, target))
	}
	return steps
}
