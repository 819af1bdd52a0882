// Package image owns the LLB assembly of images: the graph of a plan (the
// compile and link steps of package golang, shared by every image that
// carries a binary), the root filesystem of one image for one platform
// (scratch, a generated user database, /tmp and the binaries, or a base
// plus the binaries), its OCI config, the SPDX SBOM of its binaries, the
// multi-platform gateway result and the exporter attributes that make it
// reproducible.
package image

import (
	"fmt"
	"maps"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moby/buildkit/client/llb"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kiln-build/kiln/internal/config"
	"github.com/kiln-build/kiln/internal/plan"
)

// BinDir is where binaries go in every image.
const BinDir = "/usr/local/bin"

// AssembleStepName is the vertex name of an image's assembly for a platform;
// explain finds the step by it.
func AssembleStepName(image string, target ocispec.Platform) string {
	return fmt.Sprintf("[%s %s] assemble image", image, config.FormatPlatform(target))
}

// Rootfs assembles the image for one platform. binaries maps a binary name
// to the state holding it at /<name>; context holds the image folder files.
func Rootfs(img plan.Image, target ocispec.Platform, binaries map[string]llb.State, context llb.State, created time.Time) llb.State {
	if img.HasBase() {
		return onBase(img, target, binaries, context, created)
	}
	root := 0
	owner := llb.WithUIDGID(root, root)
	stamp := llb.WithCreatedTime(created)
	name := func(step string) llb.ConstraintsOpt {
		return llb.WithCustomNamef("[%s %s] %s", img.Name, config.FormatPlatform(target), step)
	}
	passwd, group := userDatabase(img.User)

	// A 1777 directory needs a copy with a mode string: mkdir masks its mode.
	emptyDir := llb.Scratch().File(llb.Mkdir("/d", 0o755, stamp), name("empty dir"))
	fa := llb.Mkdir("/etc", 0o755, owner, stamp).
		Mkfile("/etc/passwd", 0o644, passwd, owner, stamp).
		Mkfile("/etc/group", 0o644, group, owner, stamp).
		Copy(emptyDir, "/d", "/tmp", &llb.CopyInfo{Mode: &llb.ChmodOpt{ModeStr: "1777"}, ChownOpt: ownerOpt(), CreatedTime: &created}).
		Mkdir(BinDir, 0o755, llb.WithParents(true), owner, stamp)
	fa = addContent(fa, img, binaries, context, created)
	return stamped(img, target, fa, created)
}

// stamped is what fa makes on scratch, every file and directory dated
// created: fa is made on scratch first and copied as a whole, because adding
// an entry to a directory dates it now and a copy dates each directory after
// filling it. So the exporter need not rewrite the layer's times, a second
// compression of it. (On a base such a copy would also re-own and re-date
// the base's directories and fail on a symlinked one, so images on a base
// are assembled in place and their layer's times rewritten.)
func stamped(img plan.Image, target ocispec.Platform, fa *llb.FileAction, created time.Time) llb.State {
	group := llb.ProgressGroup(img.Name, "image "+img.Name, false)
	content := llb.Scratch().Platform(target).File(fa, llb.WithCustomNamef("[%s %s] image files", img.Name, config.FormatPlatform(target)), group)
	return llb.Scratch().Platform(target).File(llb.Copy(content, "/", "/", &llb.CopyInfo{CopyDirContentsOnly: true, CreatedTime: &created}),
		llb.WithCustomName(AssembleStepName(img.Name, target)), group)
}

func ownerOpt() *llb.ChownOpt {
	return &llb.ChownOpt{User: &llb.UserOpt{UID: 0}, Group: &llb.UserOpt{UID: 0}}
}

// userDatabase writes root and the image's user, so tools that look up the
// current user find a name.
func userDatabase(user string) (passwd, group []byte) {
	uid, gid, _ := strings.Cut(user, ":")
	if gid == "" {
		gid = uid
	}
	p := "root:x:0:0:root:/root:/sbin/nologin\n"
	g := "root:x:0:\n"
	if uid != "0" {
		p += fmt.Sprintf("nonroot:x:%s:%s:nonroot:/home/nonroot:/sbin/nologin\n", uid, gid)
	}
	if gid != "0" {
		g += fmt.Sprintf("nonroot:x:%s:\n", gid)
	}
	return []byte(p), []byte(g)
}

// Config is the OCI image config of one image for one platform. The
// exporter fills in the layer diff ids. base is the base image's config, nil
// on scratch: its env, entrypoint, args, user, workdir and labels are kept
// unless image.yaml sets them.
func Config(p *plan.Plan, img plan.Image, target ocispec.Platform, base *ocispec.Image) ocispec.Image {
	created := p.Created()
	var inherited ocispec.ImageConfig
	var history []ocispec.History
	if base != nil {
		inherited, history = base.Config, base.History
	}
	env := inherited.Env
	if base == nil {
		env = []string{"PATH=" + BinDir + ":/usr/bin:/bin"}
	}
	for _, k := range slices.Sorted(maps.Keys(img.Env)) {
		env = slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, k+"=") })
		env = append(env, k+"="+img.Env[k])
	}
	entrypoint, cmd := inherited.Entrypoint, inherited.Cmd
	if len(img.Entrypoint) > 0 {
		entrypoint, cmd = img.Entrypoint, nil
	}
	if len(img.Args) > 0 {
		cmd = img.Args
	}
	user, workdir := inherited.User, inherited.WorkingDir
	if img.User != "" {
		user = img.User
	}
	if img.Workdir != "" {
		workdir = img.Workdir
	}
	labels := map[string]string{}
	maps.Copy(labels, inherited.Labels)
	maps.Copy(labels, img.Labels)
	labels[ocispec.AnnotationCreated] = created.Format(time.RFC3339)
	labels[ocispec.AnnotationVersion] = p.Stamp.Version
	if rev := p.Revision; rev != "" {
		labels[ocispec.AnnotationRevision] = rev
	}
	if p.Source != "" {
		labels[ocispec.AnnotationSource] = p.Source
	}
	return ocispec.Image{
		Created:  &created,
		Platform: target,
		Config: ocispec.ImageConfig{
			User:         user,
			Env:          env,
			Entrypoint:   entrypoint,
			Cmd:          cmd,
			WorkingDir:   workdir,
			Labels:       labels,
			ExposedPorts: inherited.ExposedPorts,
			Volumes:      inherited.Volumes,
			StopSignal:   inherited.StopSignal,
		},
		RootFS: ocispec.RootFS{Type: "layers"},
		// Written here, not left to the exporter: it would describe a layer
		// taken from an imported cache as "imported <digest>", and the
		// digest would then depend on where the layer came from.
		History: append(slices.Clone(history), ocispec.History{
			Created:   &created,
			CreatedBy: fmt.Sprintf("kiln: assemble %s for %s", img.Name, config.FormatPlatform(target)),
			Comment:   "kiln",
		}),
	}
}

// addContent adds the binaries and the image folder's files.
func addContent(fa *llb.FileAction, img plan.Image, binaries map[string]llb.State, context llb.State, created time.Time) *llb.FileAction {
	for _, b := range img.Binaries {
		fa = fa.Copy(binaries[b], "/"+b, BinDir+"/"+b, &llb.CopyInfo{
			Mode: &llb.ChmodOpt{Mode: 0o755}, ChownOpt: ownerOpt(), CreatedTime: &created,
		})
	}
	for _, f := range img.Files {
		mode, _ := strconv.ParseUint(f.Mode, 8, 32) // validated by config
		fa = fa.Copy(context, path.Join(img.Dir, f.Src), f.Dest, &llb.CopyInfo{
			Mode: &llb.ChmodOpt{Mode: os.FileMode(mode)}, ChownOpt: ownerOpt(), CreatedTime: &created, CreateDestPath: true,
			CopyDirContentsOnly: f.Dir,
		})
	}
	return fa
}

// onBase layers the binaries and files on the base image for the platform:
// one layer over the base's, which keep their digests. The base's user
// database and /tmp are its own.
func onBase(img plan.Image, target ocispec.Platform, binaries map[string]llb.State, context llb.State, created time.Time) llb.State {
	ref := img.BaseFor(target)
	base := llb.Image(ref, llb.Platform(target), llb.WithCustomNamef("[%s %s] base %s", img.Name, config.FormatPlatform(target), ref))
	fa := llb.Mkdir(BinDir, 0o755, llb.WithParents(true), llb.WithUIDGID(0, 0), llb.WithCreatedTime(created))
	fa = addContent(fa, img, binaries, context, created)
	return base.File(fa, llb.WithCustomName(AssembleStepName(img.Name, target)), llb.ProgressGroup(img.Name, "image "+img.Name, false))
}
