// Command storage-reader reads an etcd the way kube-apiserver's storage does, with
// k8s.io/apiserver's own code: the storage factory (key prefix, kube-apiserver's
// resource prefixes, the protobuf storage encoding), the etcd3 store and the watch cache
// in front of it, behind the generic registry store kube-apiserver's REST handlers call.
//
// For each resource named on the command line it lists every object three ways — a
// consistent list (from etcd), a list at resourceVersion 0 (from the watch cache, which
// filled itself by a list and a watch of etcd) and a get of each object by name — and
// writes one JSON line per object and way:
//
//	{"resource": "pods", "read": "list", "object": {...}}
//
// with the object as kube-apiserver's JSON serializer writes it. Any object the storage
// cannot decode fails the whole read with kube-apiserver's own error, exit status 1.
//
// Usage: storage-reader --etcd http://127.0.0.1:2379 [--prefix /registry] RESOURCE...
// with RESOURCE as apiVersion/resource/Kind/scope, e.g. v1/pods/Pod/namespaced or
// storage.k8s.io/v1/csinodes/CSINode/cluster. A kind outside k8s.io/api is read as
// apiextensions-apiserver reads a custom resource: JSON under <prefix>/<group>/<resource>.
//
// storage-reader normalize reads JSON objects (with apiVersion and kind), one a line, and
// writes each as kube-apiserver would serve it once decoded: what another server's JSON
// is compared against, since a field the Go types keep (a zero time as null, an empty
// struct as {}) may be written or left out with the same meaning.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/server/options"
	serverstorage "k8s.io/apiserver/pkg/server/storage"
	"k8s.io/apiserver/pkg/storage/names"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/kubernetes/scheme"
)

// kube-apiserver's own resource prefixes, those that differ from the resource's name
// (SpecialDefaultResourcePrefixes in k8s.io/kubernetes pkg/kubeapiserver).
var specialPrefixes = map[schema.GroupResource]string{
	{Group: "", Resource: "replicationcontrollers"}:     "controllers",
	{Group: "", Resource: "endpoints"}:                  "services/endpoints",
	{Group: "", Resource: "nodes"}:                      "minions",
	{Group: "", Resource: "services"}:                   "services/specs",
	{Group: "extensions", Resource: "ingresses"}:        "ingress",
	{Group: "networking.k8s.io", Resource: "ingresses"}: "ingress",
}

type resource struct {
	gv         schema.GroupVersion
	name, kind string
	namespaced bool
}

func parseResource(arg string) (resource, error) {
	parts := strings.Split(arg, "/")
	if len(parts) == 4 {
		parts = append([]string{""}, parts...)
	}
	if len(parts) != 5 || (parts[4] != "namespaced" && parts[4] != "cluster") {
		return resource{}, fmt.Errorf("%q: want apiVersion/resource/Kind/namespaced|cluster", arg)
	}
	return resource{
		gv:         schema.GroupVersion{Group: parts[0], Version: parts[1]},
		name:       parts[2],
		kind:       parts[3],
		namespaced: parts[4] == "namespaced",
	}, nil
}

// Each resource is stored and held in memory at the version named for it: kube-apiserver
// holds internal types in memory, which live outside k8s.io/api; its storage codec
// decodes the same bytes either way.
type encodings map[schema.GroupResource]schema.GroupVersion

func (e encodings) StorageEncodingFor(gr schema.GroupResource) (schema.GroupVersion, error) {
	if gv, ok := e[gr]; ok {
		return gv, nil
	}
	return schema.GroupVersion{}, fmt.Errorf("no version for %s", gr)
}

func (e encodings) InMemoryEncodingFor(gr schema.GroupResource) (schema.GroupVersion, error) {
	return e.StorageEncodingFor(gr)
}

// The registry store wants create and delete strategies; this reader never writes.
type readOnly struct {
	runtime.ObjectTyper
	names.NameGenerator
	namespaced bool
}

func (s readOnly) NamespaceScoped() bool                                  { return s.namespaced }
func (readOnly) PrepareForCreate(context.Context, runtime.Object)         {}
func (readOnly) Validate(context.Context, runtime.Object) field.ErrorList { return nil }
func (readOnly) WarningsOnCreate(context.Context, runtime.Object) []string {
	return nil
}
func (readOnly) Canonicalize(runtime.Object) {}

func main() {
	if len(os.Args) == 2 && os.Args[1] == "normalize" {
		normalize()
		return
	}
	etcd := flag.String("etcd", "", "the etcd's client URL")
	prefix := flag.String("prefix", "/registry", "kube-apiserver's --etcd-prefix")
	flag.Parse()
	if *etcd == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: storage-reader --etcd URL [--prefix P] apiVersion/resource/Kind/namespaced|cluster ...")
		os.Exit(2)
	}
	var resources []resource
	enc := encodings{}
	for _, arg := range flag.Args() {
		r, err := parseResource(arg)
		if err != nil {
			fail(err)
		}
		resources = append(resources, r)
		enc[r.gv.WithResource(r.name).GroupResource()] = r.gv
	}

	// As kube-apiserver configures it: protobuf, its key prefix, its resource prefixes,
	// and the watch cache in front of each resource.
	etcdOptions := options.NewEtcdOptions(storagebackend.NewDefaultConfig(*prefix, nil))
	etcdOptions.StorageConfig.Transport.ServerList = []string{*etcd}
	etcdOptions.EnableWatchCache = true
	factory := serverstorage.NewDefaultStorageFactory(
		etcdOptions.StorageConfig,
		runtime.ContentTypeProtobuf,
		scheme.Codecs,
		enc,
		serverstorage.NewResourceConfig(),
		specialPrefixes,
	)
	restOptions := &options.StorageFactoryRestOptionsFactory{Options: *etcdOptions, StorageFactory: factory}
	// Kinds outside k8s.io/api are custom resources: as apiextensions-apiserver stores
	// them, JSON under <prefix>/<group>/<resource>.
	customEtcd := *etcdOptions
	customEtcd.StorageConfig.Codec = unstructured.UnstructuredJSONScheme
	customOptions := &options.StorageFactoryRestOptionsFactory{
		Options:        customEtcd,
		StorageFactory: &options.SimpleStorageFactory{StorageConfig: customEtcd.StorageConfig},
	}
	jsonInfo, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)

	out := json.NewEncoder(os.Stdout)
	ctx := genericapirequest.WithNamespace(genericapirequest.NewContext(), metav1.NamespaceAll)
	for _, r := range resources {
		gr := r.gv.WithResource(r.name).GroupResource()
		store := &genericregistry.Store{
			DefaultQualifiedResource:  gr,
			SingularQualifiedResource: schema.GroupResource{Group: gr.Group, Resource: strings.ToLower(r.kind)},
			CreateStrategy:            readOnly{scheme.Scheme, names.SimpleNameGenerator, r.namespaced},
			DeleteStrategy:            readOnly{scheme.Scheme, names.SimpleNameGenerator, r.namespaced},
			TableConvertor:            rest.NewDefaultTableConvertor(gr),
		}
		var storage generic.RESTOptionsGetter
		var encoder runtime.Encoder
		if builtIn := r.gv.WithKind(r.kind); scheme.Scheme.Recognizes(builtIn) {
			list := r.gv.WithKind(r.kind + "List")
			store.NewFunc = func() runtime.Object { o, _ := scheme.Scheme.New(builtIn); return o }
			store.NewListFunc = func() runtime.Object { o, _ := scheme.Scheme.New(list); return o }
			storage, encoder = restOptions, scheme.Codecs.EncoderForVersion(jsonInfo.Serializer, r.gv)
		} else {
			store.NewFunc, store.NewListFunc = customResource(r)
			storage, encoder = customOptions, unstructured.UnstructuredJSONScheme
		}
		if err := store.CompleteWithOptions(&generic.StoreOptions{RESTOptions: storage}); err != nil {
			fail(fmt.Errorf("%s: %w", gr, err))
		}
		emit := func(read string, obj runtime.Object) {
			var b strings.Builder
			if err := encoder.Encode(obj, &b); err != nil {
				fail(fmt.Errorf("%s: encode: %w", gr, err))
			}
			if err := out.Encode(map[string]any{"resource": r.name, "read": read, "object": json.RawMessage(b.String())}); err != nil {
				fail(err)
			}
		}
		for _, read := range []struct{ name, rv string }{{"list", ""}, {"cache", "0"}} {
			list, err := listWhenReady(ctx, store, read.rv)
			if err != nil {
				fail(fmt.Errorf("%s: list (resourceVersion %q): %w", gr, read.rv, err))
			}
			items, err := meta.ExtractList(list)
			if err != nil {
				fail(err)
			}
			for _, item := range items {
				emit(read.name, item)
				if read.name != "list" {
					continue
				}
				m, _ := meta.Accessor(item)
				objCtx := genericapirequest.WithNamespace(ctx, m.GetNamespace())
				got, err := store.Get(objCtx, m.GetName(), &metav1.GetOptions{})
				if err != nil {
					fail(fmt.Errorf("%s %s/%s: get: %w", gr, m.GetNamespace(), m.GetName(), err))
				}
				emit("get", got)
			}
		}
		store.DestroyFunc()
	}
}

func normalize() {
	jsonInfo, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(nil, 64<<20)
	for in.Scan() {
		obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(in.Bytes(), nil, nil)
		if runtime.IsNotRegisteredError(err) {
			// A custom resource: kube-apiserver keeps it as the JSON it was given.
			fmt.Println(in.Text())
			continue
		}
		if err != nil {
			fail(fmt.Errorf("normalize: %w", err))
		}
		encoder := scheme.Codecs.EncoderForVersion(jsonInfo.Serializer, gvk.GroupVersion())
		if err := encoder.Encode(obj, os.Stdout); err != nil {
			fail(fmt.Errorf("normalize %s: %w", gvk, err))
		}
	}
	if err := in.Err(); err != nil {
		fail(err)
	}
}

// A custom resource's object and list, as apiextensions-apiserver makes them.
func customResource(r resource) (func() runtime.Object, func() runtime.Object) {
	return func() runtime.Object {
			o := &unstructured.Unstructured{}
			o.SetGroupVersionKind(r.gv.WithKind(r.kind))
			return o
		}, func() runtime.Object {
			o := &unstructured.UnstructuredList{}
			o.SetGroupVersionKind(r.gv.WithKind(r.kind + "List"))
			return o
		}
}

// A list as kube-apiserver serves it: while the watch cache fills itself, it answers
// 429 "storage is (re)initializing", and clients retry.
func listWhenReady(ctx context.Context, store *genericregistry.Store, rv string) (runtime.Object, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := store.List(ctx, &metainternalversion.ListOptions{ResourceVersion: rv})
		if !apierrors.IsTooManyRequests(err) || time.Now().After(deadline) {
			return list, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "storage-reader:", err)
	os.Exit(1)
}
