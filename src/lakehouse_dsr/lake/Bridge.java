// Bulk reads of Iceberg metadata for lakehouse-dsr, compiled inside the driver's JVM by Janino
// (bridge.py). Each method answers in one Py4J round trip what element-by-element access over Py4J
// answers in hundreds (a Java map or list is otherwise read one entry per round trip). Answers are
// JSON strings; nothing here reads a data file or a row.
// Janino compiles Java with generics erased: raw types and explicit casts throughout.
package lakehouse_dsr;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.io.IOException;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.HashSet;
import java.util.Set;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.RemoteIterator;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.iceberg.ContentFile;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.FileScanTask;
import org.apache.iceberg.ManifestFile;
import org.apache.iceberg.ManifestFiles;
import org.apache.iceberg.ManifestReader;
import org.apache.iceberg.OverwriteFiles;
import org.apache.iceberg.ScanTaskGroup;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.SnapshotRef;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableMetadata;
import org.apache.iceberg.HasTableOperations;
import org.apache.iceberg.io.CloseableIterator;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.util.ContentFileUtil;
import org.apache.iceberg.util.TableScanUtil;
import py4j.reflection.ClassLoadingStrategy;
import py4j.reflection.ReflectionUtil;

public class Bridge {
  private final ObjectMapper json = new ObjectMapper();

  /** `table` registered with Iceberg's Spark source under `key` (its SparkTableCache), or `key`
   *  removed when `table` is null: a staged read or rewrite loads the table by its task set's id.
   *  Here because Py4J does not find the cache's static `get()` beside its instance `get(key)`. */
  public void cacheTable(String key, Table table) {
    if (table == null) {
      org.apache.iceberg.spark.SparkTableCache.get().remove(key);
    } else {
      org.apache.iceberg.spark.SparkTableCache.get().add(key, table);
    }
  }

  public String toJson(Object value) throws Exception {
    return json.writeValueAsString(value);
  }

  private Map snapshotMap(Snapshot s) {
    Map m = new HashMap();
    m.put("id", Long.valueOf(s.snapshotId()));
    m.put("parent", s.parentId());
    m.put("ms", Long.valueOf(s.timestampMillis()));
    m.put("operation", s.operation());
    m.put("summary", s.summary());
    m.put("manifest_list", s.manifestListLocation());
    m.put("sequence", Long.valueOf(s.sequenceNumber()));
    return m;
  }

  /** One snapshot (null: none): id, parent, ms, operation, summary, manifest_list. */
  public String snapshot(Snapshot s) throws Exception {
    return toJson(s == null ? null : snapshotMap(s));
  }

  /** Every snapshot of the table's metadata, in commit order. */
  public String snapshots(Table table) throws Exception {
    List out = new ArrayList();
    for (Iterator it = table.snapshots().iterator(); it.hasNext(); ) {
      out.add(snapshotMap((Snapshot) it.next()));
    }
    return toJson(out);
  }

  /** The table's refs (main included): name, kind, snapshot id and retention settings. */
  public String refs(Table table) throws Exception {
    List refs = new ArrayList();
    Map found = table.refs();
    for (Iterator it = found.keySet().iterator(); it.hasNext(); ) {
      String name = (String) it.next();
      SnapshotRef ref = (SnapshotRef) found.get(name);
      Map r = new HashMap();
      r.put("name", name);
      r.put("kind", ref.isBranch() ? "BRANCH" : "TAG");
      r.put("snapshot_id", Long.valueOf(ref.snapshotId()));
      r.put("min_snapshots_to_keep", ref.minSnapshotsToKeep());
      r.put("max_snapshot_age_ms", ref.maxSnapshotAgeMs());
      refs.add(r);
    }
    return toJson(refs);
  }

  /** The table's top-level column names, in schema order. */
  public String columns(Table table) throws Exception {
    List out = new ArrayList();
    for (Iterator it = table.schema().columns().iterator(); it.hasNext(); ) {
      out.add(((org.apache.iceberg.types.Types.NestedField) it.next()).name());
    }
    return toJson(out);
  }

  /** The locations of content files (data or delete files). */
  public String locations(Iterable files) throws Exception {
    List out = new ArrayList();
    for (Iterator it = files.iterator(); it.hasNext(); ) {
      out.add(((ContentFile) it.next()).location());
    }
    return toJson(out);
  }

  /** Each scan task's data sequence number (null: a format-v1 table's files have none). */
  public String taskSequences(List tasks) throws Exception {
    List out = new ArrayList();
    for (int i = 0; i < tasks.size(); i++) {
      out.add(((FileScanTask) tasks.get(i)).file().dataSequenceNumber());
    }
    return toJson(out);
  }

  /** Per scan task: [data file location, its size in bytes, its records, its delete files]. */
  public String taskFiles(List tasks) throws Exception {
    List out = new ArrayList();
    for (int i = 0; i < tasks.size(); i++) {
      FileScanTask task = (FileScanTask) tasks.get(i);
      DataFile f = (DataFile) task.file();
      List entry = new ArrayList();
      entry.add(f.location());
      entry.add(Long.valueOf(f.fileSizeInBytes()));
      entry.add(Long.valueOf(f.recordCount()));
      entry.add(Integer.valueOf(task.deletes().size()));
      out.add(entry);
    }
    return toJson(out);
  }

  /** The data files of scan tasks, as a Java list (they stay in the JVM for a commit). */
  public List dataFiles(List tasks) {
    List out = new ArrayList();
    for (int i = 0; i < tasks.size(); i++) {
      out.add(((FileScanTask) tasks.get(i)).file());
    }
    return out;
  }

  /** The items of `items` at the positions listed in `positions` (a JSON array), as a Java list. */
  public List pick(List items, String positions) throws Exception {
    List out = new ArrayList();
    List chosen = (List) json.readValue(positions, List.class);
    for (int i = 0; i < chosen.size(); i++) {
      out.add(items.get(((Number) chosen.get(i)).intValue()));
    }
    return out;
  }

  /**
   * The heaviest of `groups`' weights (JSON: lists of indexes into `items`, FileScanTasks, each
   * group's first file its largest), if Iceberg's own packing (TableScanUtil.planTaskGroups, a
   * lookback of 1, no open cost) under that split turns the tasks in group order into exactly those
   * groups, one Spark task each: a group closes when the next group's first file would overfill it.
   * 0 when the packing makes other groups (only that split is tried).
   */
  public long splitForGroups(List items, String groups) throws Exception {
    List chosen = (List) json.readValue(groups, List.class);
    List ordered = new ArrayList();
    List expected = new ArrayList();
    long split = 0L;
    for (int g = 0; g < chosen.size(); g++) {
      List group = (List) chosen.get(g);
      long weight = 0L;
      List locations = new ArrayList();
      for (int i = 0; i < group.size(); i++) {
        FileScanTask task = (FileScanTask) items.get(((Number) group.get(i)).intValue());
        ordered.add(task);
        locations.add(task.file().location());
        weight += task.sizeBytes();
      }
      expected.add(locations);
      split = Math.max(split, weight);
    }
    List packed = TableScanUtil.planTaskGroups(ordered, split, 1, 0L);
    if (packed.size() != expected.size()) {
      return 0L;
    }
    for (int g = 0; g < packed.size(); g++) {
      List locations = new ArrayList();
      for (Iterator it = ((ScanTaskGroup) packed.get(g)).tasks().iterator(); it.hasNext(); ) {
        locations.add(((FileScanTask) it.next()).file().location());
      }
      if (!locations.equals(expected.get(g))) {
        return 0L;
      }
    }
    return split;
  }

  /** Per delete file: [the one data file it applies to, or null when it is not scoped to one; its own location]. */
  public String deleteTargets(Iterable deleteFiles) throws Exception {
    List out = new ArrayList();
    for (Iterator it = deleteFiles.iterator(); it.hasNext(); ) {
      ContentFile f = (ContentFile) it.next();
      List entry = new ArrayList();
      entry.add(ContentFileUtil.referencedDataFileLocation((org.apache.iceberg.DeleteFile) f));
      entry.add(f.location());
      out.add(entry);
    }
    return toJson(out);
  }

  /** Every data and delete file a snapshot references (its manifests' live entries). */
  public String liveFiles(Table table, Snapshot snapshot) throws Exception {
    FileIO io = table.io();
    List out = new ArrayList();
    for (Iterator it = snapshot.dataManifests(io).iterator(); it.hasNext(); ) {
      addLocations(ManifestFiles.read((ManifestFile) it.next(), io, table.specs()), out);
    }
    for (Iterator it = snapshot.deleteManifests(io).iterator(); it.hasNext(); ) {
      addLocations(ManifestFiles.readDeleteManifest((ManifestFile) it.next(), io, table.specs()), out);
    }
    return toJson(out);
  }

  private void addLocations(ManifestReader reader, List out) throws Exception {
    try {
      CloseableIterator entries = reader.iterator();
      while (entries.hasNext()) {
        out.add(((ContentFile) entries.next()).location());
      }
    } finally {
      reader.close();
    }
  }

  /** The paths of the metadata files the table's metadata names: manifests (of every snapshot
   *  when `allManifests`, else none), manifest lists, statistics files, the current and previous
   *  metadata files. */
  public String metadataFiles(Table table, boolean allManifests) throws Exception {
    FileIO io = table.io();
    TableMetadata metadata = ((HasTableOperations) table).operations().current();
    List out = new ArrayList();
    out.add(metadata.metadataFileLocation());
    for (Iterator it = metadata.previousFiles().iterator(); it.hasNext(); ) {
      out.add(((TableMetadata.MetadataLogEntry) it.next()).file());
    }
    for (Iterator it = table.snapshots().iterator(); it.hasNext(); ) {
      Snapshot s = (Snapshot) it.next();
      out.add(s.manifestListLocation());
      if (allManifests) {
        for (Iterator m = s.allManifests(io).iterator(); m.hasNext(); ) {
          out.add(((ManifestFile) m.next()).path());
        }
      }
    }
    for (Iterator it = metadata.statisticsFiles().iterator(); it.hasNext(); ) {
      out.add(((org.apache.iceberg.StatisticsFile) it.next()).path());
    }
    for (Iterator it = metadata.partitionStatisticsFiles().iterator(); it.hasNext(); ) {
      out.add(((org.apache.iceberg.PartitionStatisticsFile) it.next()).path());
    }
    return toJson(out);
  }

  /** Those of `paths` that no reader can take as Parquet, and those gone meanwhile: {"torn": [...],
   *  "gone": [...]}. Torn: shorter than Parquet's framing, without its magic at either end, with a
   *  footer longer than the file, or failing the file system's checksum where those bytes lie (a
   *  write cut short by a full disk or a killed task leaves such files). Reads 12 bytes per file. */
  public String unreadableParquet(FileSystem fs, List paths) throws Exception {
    List torn = new ArrayList();
    List gone = new ArrayList();
    for (int i = 0; i < paths.size(); i++) {
      String path = (String) paths.get(i);
      try {
        if (!parquetFramed(fs, new Path(path))) {
          torn.add(path);
        }
      } catch (java.io.FileNotFoundException e) {
        gone.add(path);
      } catch (IOException e) {  // a checksum that fails, a read cut short
        torn.add(path);
      }
    }
    Map out = new HashMap();
    out.put("torn", torn);
    out.put("gone", gone);
    return toJson(out);
  }

  private static boolean parquetFramed(FileSystem fs, Path path) throws IOException {
    long length = fs.getFileStatus(path).getLen();
    if (length < 12) {
      return false;
    }
    byte[] head = new byte[4];
    byte[] tail = new byte[8];
    org.apache.hadoop.fs.FSDataInputStream in = fs.open(path);
    try {
      in.readFully(0, head);
      in.readFully(length - 8, tail);
    } finally {
      in.close();
    }
    long footer = (tail[0] & 0xffL) | (tail[1] & 0xffL) << 8 | (tail[2] & 0xffL) << 16 | (tail[3] & 0xffL) << 24;
    return isMagic(head, 0) && isMagic(tail, 4) && footer > 0 && footer <= length - 12;
  }

  private static boolean isMagic(byte[] bytes, int at) {
    return bytes[at] == 'P' && bytes[at + 1] == 'A' && bytes[at + 2] == 'R' && bytes[at + 3] == '1';
  }

  /** Every file below `location` (recursively): [path, modification time in ms]. Object stores
   *  answer listFiles with one flat listing. On the local file system listFiles builds
   *  LocatedFileStatus objects, each asking for its file's permissions, which Hadoop answers by
   *  running `ls` per file: there a listStatus walk (137 ms -> 2 ms for a table's folder). */
  public String listFiles(FileSystem fs, Path location) throws Exception {
    List out = new ArrayList();
    if (!"file".equals(fs.getUri().getScheme())) {
      RemoteIterator files = fs.listFiles(location, true);
      while (files.hasNext()) {
        FileStatus status = (FileStatus) files.next();
        addFile(out, status);
      }
      return toJson(out);
    }
    if (!fs.exists(location)) {
      return toJson(out);
    }
    ArrayList pending = new ArrayList();
    pending.add(location);
    while (!pending.isEmpty()) {
      FileStatus[] children = fs.listStatus((Path) pending.remove(pending.size() - 1));
      for (int i = 0; i < children.length; i++) {
        if (children[i].isDirectory()) {
          pending.add(children[i].getPath());
        } else {
          addFile(out, children[i]);
        }
      }
    }
    return toJson(out);
  }

  private void addFile(List out, FileStatus status) {
    List entry = new ArrayList();
    entry.add(status.getPath().toString());
    entry.add(Long.valueOf(status.getModificationTime()));
    out.add(entry);
  }

  /** Replace `old` data files by `added` ones in one overwrite operation (committed by the caller). */
  public void replace(OverwriteFiles operation, Iterable old, Iterable added) {
    for (Iterator it = old.iterator(); it.hasNext(); ) {
      operation.deleteFile((DataFile) it.next());
    }
    for (Iterator it = added.iterator(); it.hasNext(); ) {
      operation.addFile((DataFile) it.next());
    }
  }

  /** Hadoop's local file system, setting permissions through java.nio. Without Hadoop's native
   *  library (pip's PySpark has none) the stock one runs a `chmod` process for every file and
   *  directory it creates, twice with its checksum files: about 10 ms per file written, thousands
   *  of processes in a run over a wide lake. */
  public static class LocalFiles extends RawLocalFileSystem {
    public void setPermission(Path p, FsPermission permission) throws IOException {
      PosixFilePermission[] all = PosixFilePermission.values(); // OWNER_READ ... OTHERS_EXECUTE
      Set chosen = new HashSet();
      for (int i = 0; i < all.length; i++) {
        if ((permission.toShort() & (1 << (8 - i))) != 0) {
          chosen.add(all[i]);
        }
      }
      try {
        Files.setPosixFilePermissions(pathToFile(p).toPath(), chosen);
      } catch (UnsupportedOperationException notPosix) {
        super.setPermission(p, permission);
      }
    }
  }

  /** Make `file:` paths opened through Hadoop's file-system cache use LocalFiles (with checksums,
   *  as the stock LocalFileSystem). Hadoop's only way in is its package-private cache entry point,
   *  reached by reflection. Paths opened outside the cache keep Hadoop's own class. */
  public void useLocalFiles(Configuration conf) throws Exception {
    URI uri = URI.create("file:///");
    LocalFileSystem fs = new LocalFileSystem(new LocalFiles());
    fs.initialize(uri, conf);
    java.lang.reflect.Method add = FileSystem.class.getDeclaredMethod(
        "addFileSystemForTesting", new Class[] {URI.class, Configuration.class, FileSystem.class});
    add.setAccessible(true);
    add.invoke(null, new Object[] {uri, conf, fs});
  }

  /** Py4J's class lookups, remembering the names that are not classes. Py4J resolves every
   *  `jvm.a.b.C` segment, and every name PySpark reaches through its star imports (each `F.col`
   *  tries several packages), by asking the class loader, which answers "no such class" only after
   *  searching every jar on the class path: a tenth of the driver's CPU in a run over a wide lake. */
  public static class RememberingClassLoading implements ClassLoadingStrategy {
    private final ClassLoadingStrategy inner;
    private final Set missing = java.util.concurrent.ConcurrentHashMap.newKeySet();

    public RememberingClassLoading(ClassLoadingStrategy inner) {
      this.inner = inner;
    }

    public Class classForName(String name) throws ClassNotFoundException {
      // Per loader: a thread with another context class loader may see other classes.
      String key = System.identityHashCode(getClassLoader()) + ":" + name;
      if (missing.contains(key)) {
        throw new ClassNotFoundException(name);
      }
      try {
        return inner.classForName(name);
      } catch (ClassNotFoundException notFound) {
        missing.add(key);
        throw notFound;
      }
    }

    public ClassLoader getClassLoader() {
      return inner.getClassLoader();
    }

    /** Whether `name` is remembered as missing for the current class loader. */
    public boolean remembersMissing(String name) {
      return missing.contains(System.identityHashCode(getClassLoader()) + ":" + name);
    }
  }

  /** Make Py4J remember missing classes (once per JVM). For sessions whose class path does not grow
   *  later: a jar added at run time would not be searched for a name already found missing. */
  public void rememberMissingClasses() {
    if (!(ReflectionUtil.getClassLoadingStrategy() instanceof RememberingClassLoading)) {
      ReflectionUtil.setClassLoadingStrategy(new RememberingClassLoading(ReflectionUtil.getClassLoadingStrategy()));
    }
  }

  /** A clustering function for RewriteManifests.clusterBy that puts every data file in one group
   *  (Iceberg still starts a new manifest at its target size). */
  public static class OneGroup implements java.util.function.Function {
    public Object apply(Object dataFile) {
      return Integer.valueOf(0);
    }
  }

  public java.util.function.Function oneGroup() {
    return new OneGroup();
  }
}
