// Package export owns the export of files a solve made into a folder of
// this machine (binaries, release assets, size's unstripped builds): each
// file read through the gateway from the step that made it, one still as
// kiln wrote it linked rather than sent, a sent one written into the file
// it replaced (a spare) when no one else holds it, the folder replaced
// whole or not at all.
package export

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	gateway "github.com/moby/buildkit/frontend/gateway/client"

	"github.com/kiln-build/kiln/internal/buildkit"

	"github.com/moby/buildkit/client"
	"github.com/moby/buildkit/client/llb"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/errgroup"
)

// Written tells how kiln last wrote a file of an export's folder when the
// file is still as written and its times tell one link's binary from
// another's: its size and modification time; false otherwise.
type Written func(path string) (size, modTime int64, ok bool)

// FileCopy is one file of a directory export. When From is one output of
// a go build step (Graph.Linked), the export must list every binary of
// that step, as Binaries does: BuildKit keeps no result of the outputs a
// solve did not ask for, and a later solve would run the step again.
type FileCopy struct {
	From      llb.State
	Src, Dest string
}

// ReadChunk is the size of one gateway read. The daemon answers up to
// 16 MiB; four reads in flight of 2 MiB each moved two 8.9 MB binaries in
// 75-90 ms here, where the local exporter took 110-150 ms.
const (
	ReadChunk     = 2 << 20
	readsInFlight = 4
)

// Files solves the files and writes them into one directory at dest,
// replacing what was there only when the solve succeeded. The files are
// read through the gateway straight from the steps that made them: no
// step collects them and no exporter runs. written tells how kiln last wrote
// dest's files: a file still as written, whose source in
// the daemon has the size and modification time it was written with
// (kilnstep gives a binary the nanosecond of the link that made it), is
// that link's binary, so it is not sent again but linked into the new
// directory. An edit to one binary then moves one file per platform, not
// all of them. A time in whole seconds (a layer from a registry cache
// keeps no more) or a host without change times keeps nothing. sent are
// the files of dest that were sent.
func Files(ctx context.Context, d *buildkit.Daemon, name string, files []FileCopy, dest string, written Written, opts buildkit.SolveOptions) (steps buildkit.Steps, sent []string, err error) {
	held := map[int]bool{} // files dest holds already
	var made []*llb.Definition
	job := buildkit.Job{
		Name: name,
		Dest: dest,
		Fetch: func(ctx context.Context, c gateway.Client, dir string, send func(*client.SolveStatus)) (*gateway.Result, error) {
			imports := buildkit.CacheImports(c)
			// Files of one output (a binary of a go build) need one solve.
			var order []digest.Digest
			byOutput := map[digest.Digest][]int{}
			defs := map[digest.Digest]*llb.Definition{}
			var waitFor []llb.State
			for i, f := range files {
				def, err := opts.MarshalState(ctx, f.From)
				if err != nil {
					return nil, err
				}
				key := digest.FromBytes(def.Def[len(def.Def)-1])
				if _, seen := defs[key]; !seen {
					waitFor = append(waitFor, f.From)
					order = append(order, key)
				}
				defs[key] = def
				made = append(made, def)
				byOutput[key] = append(byOutput[key], i)
			}
			// One solve runs every step the files come from side by side,
			// asking for every output (BuildKit keeps the result of only
			// those a solve asked for); then each is solved again, done,
			// one at a time. BuildKit was seen to release a step's result
			// twice when solves sharing steps ran at once in one job, and
			// a later step then found that mount empty.
			if len(waitFor) > 1 {
				def, err := opts.MarshalState(ctx, buildkit.Together(fmt.Sprintf("[%s] wait for every platform", name), waitFor...))
				if err != nil {
					return nil, err
				}
				if _, err := c.Solve(ctx, gateway.SolveRequest{Definition: def.ToPB(), CacheImports: imports, Evaluate: true}); err != nil {
					return nil, err
				}
				made = append(made, def)
			}
			// A layer cache export holds what the job's result holds: a
			// merge of every output, keyed on their keys, from which a
			// fresh daemon takes each step's result (TestRegistryLayerCache-
			// AcrossDaemons). Made only for an export: it costs 20-40 ms,
			// where the wait above, keyed on no content, is found done.
			var result *gateway.Result
			if len(opts.CacheExports) > 0 {
				def, err := opts.MarshalState(ctx, llb.Merge(waitFor, llb.WithCustomNamef("[%s] outputs for the layer cache", name)))
				if err != nil {
					return nil, err
				}
				if result, err = c.Solve(ctx, gateway.SolveRequest{Definition: def.ToPB(), CacheImports: imports, Evaluate: true}); err != nil {
					return nil, err
				}
			}
			var reads []reading
			var total int64
			for _, key := range order {
				r, err := c.Solve(ctx, gateway.SolveRequest{Definition: defs[key].ToPB(), CacheImports: imports})
				if err != nil {
					return nil, err
				}
				ref, err := r.SingleRef()
				if err != nil {
					return nil, err
				}
				for _, i := range byOutput[key] {
					st, err := ref.StatFile(ctx, gateway.StatRequest{Path: files[i].Src})
					if err != nil {
						return nil, err
					}
					if !os.FileMode(st.Mode).IsRegular() {
						return nil, fmt.Errorf("%s: %s is not a regular file (%v)", name, files[i].Src, os.FileMode(st.Mode).Type())
					}
					if size, modTime, ok := written(filepath.Join(dest, files[i].Dest)); ok && st.Size == size && st.ModTime == modTime {
						held[i] = true
						continue
					}
					reads = append(reads, reading{ref: ref, src: files[i].Src, dest: files[i].Dest, size: st.Size, modTime: st.ModTime})
					total += st.Size
				}
			}
			if len(reads) == 0 {
				return result, nil
			}
			progress := buildkit.NewSending(send, fmt.Sprintf("sending %d files to %s", len(reads), dest), total)
			err = readFiles(ctx, dir, dest, reads, progress)
			progress.Finish(err)
			return result, err
		},
		Complete: func(dir string) error {
			for i := range held {
				from, to := filepath.Join(dest, files[i].Dest), filepath.Join(dir, files[i].Dest)
				if _, _, ok := written(from); !ok {
					return fmt.Errorf("%s changed while kiln built (another build writing to %s?): build again", from, dest)
				}
				if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
					return err
				}
				if err := os.Link(from, to); err != nil {
					// No hard links there (another file system, a protected
					// link): a copy with the same time does as well.
					if err := copyFile(from, to); err != nil {
						return fmt.Errorf("keep %s: %w", from, err)
					}
				}
			}
			var replaced []string
			for i, f := range files {
				if !held[i] {
					replaced = append(replaced, f.Dest)
				}
			}
			keepSpares(dest, replaced, files)
			return nil
		},
	}
	out, err := d.Solve(ctx, []buildkit.Job{job}, opts)
	if err != nil {
		return nil, nil, err
	}
	if opts.Solved != nil {
		for _, def := range made {
			opts.Solved(def)
		}
	}
	for i, f := range files {
		if !held[i] {
			sent = append(sent, filepath.Join(dest, f.Dest))
		}
	}
	return out.Steps, sent, nil
}

// reading is one file to read from a solved step into an export.
type reading struct {
	ref     gateway.Reference
	src     string
	dest    string
	size    int64
	modTime int64
}

// readFiles writes each file into dir at its dest, mode 0755, with the
// modification time it has in BuildKit, reading readsInFlight chunks at
// once so that the daemon reads the next while this side writes. Every
// file is created before the first read, and every read has ended when it
// returns. A file with a spare (keepSpares) beside dest is written into it.
func readFiles(ctx context.Context, dir, dest string, reads []reading, progress *buildkit.Sending) error {
	out := make([]*os.File, len(reads))
	defer func() {
		for _, f := range out {
			if f != nil {
				f.Close()
			}
		}
	}()
	for i, r := range reads {
		rel := exportRel(r.dest)
		if !filepath.IsLocal(rel) {
			return fmt.Errorf("export to %s: %s is outside it", dir, r.dest)
		}
		to := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
		if err != nil {
			return err
		}
		if spare := takeSpare(dest, rel, to); spare != nil {
			f.Close()
			f = spare
		} else if fi, err := os.Lstat(to); err != nil || !sameFile(f, fi) { // a spare moved in, then refused
			f.Close()
			if f, err = os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755); err != nil {
				return err
			}
		}
		out[i] = f
		if err := f.Chmod(0o755); err != nil { // whatever the umask
			return err
		}
	}
	eg, ctx := errgroup.WithContext(ctx)
	eg.SetLimit(readsInFlight)
	for i, r := range reads {
		for off := int64(0); off < r.size && ctx.Err() == nil; off += ReadChunk {
			eg.Go(func() error {
				n := min(ReadChunk, r.size-off)
				dt, err := r.ref.ReadFile(ctx, gateway.ReadRequest{Filename: r.src, Range: &gateway.FileRange{Offset: int(off), Length: int(n)}})
				if err != nil {
					return fmt.Errorf("read %s: %w", r.src, err)
				}
				if int64(len(dt)) != n {
					return fmt.Errorf("read %s: %d bytes at %d, want %d (did the step's output change?)", r.src, len(dt), off, n)
				}
				if _, err := out[i].WriteAt(dt, off); err != nil {
					return err
				}
				progress.Add(n)
				return nil
			})
		}
	}
	if err := eg.Wait(); err != nil {
		return err
	}
	for i, r := range reads {
		f := out[i]
		out[i] = nil
		if err := f.Truncate(r.size); err != nil { // a spare may be longer
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		t := time.Unix(0, r.modTime)
		if err := os.Chtimes(f.Name(), t, t); err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies a file with its mode and modification time.
func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	if err := dst.Close(); err != nil {
		return err
	}
	return os.Chtimes(to, fi.ModTime(), fi.ModTime())
}

// exportRel is a file's path in an export's folder, from its FileCopy.Dest.
func exportRel(dest string) string { return strings.TrimPrefix(filepath.ToSlash(dest), "/") }

func sameFile(f *os.File, fi os.FileInfo) bool {
	open, err := f.Stat()
	return err == nil && os.SameFile(open, fi)
}
