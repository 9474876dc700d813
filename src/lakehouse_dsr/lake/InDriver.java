// Small tables erased inside the driver's JVM, compiled there by Janino (indriver.py): the key
// columns of a few small files are read, and the files holding requested rows rewritten, with
// Iceberg's generic Parquet readers and writers. A Spark query costs a fixed ~0.2-0.5 s of planning
// and scheduling on the driver whatever it reads; a small file costs milliseconds this way.
// The batch's key values arrive as JVM objects (never as command text) and no value leaves the JVM:
// answers name files, request ids and counts.
// Janino compiles Java with generics erased: raw types and explicit casts throughout.
package lakehouse_dsr;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.ArrayList;
import java.util.Arrays;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.Collections;
import java.util.HashSet;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicLongArray;
import java.util.function.BiFunction;
import java.util.function.Function;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import org.apache.iceberg.ContentFile;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.FileScanTask;
import org.apache.iceberg.PartitionField;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.Schema;
import org.apache.iceberg.StructLike;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableProperties;
import org.apache.iceberg.data.GenericAppenderFactory;
import org.apache.iceberg.data.IdentityPartitionConverters;
import org.apache.iceberg.data.Record;
import org.apache.iceberg.data.parquet.GenericParquetReaders;
import org.apache.iceberg.deletes.PositionDelete;
import org.apache.iceberg.deletes.PositionDeleteWriter;
import org.apache.iceberg.expressions.Expression;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.io.CloseableIterator;
import org.apache.iceberg.io.DataWriter;
import org.apache.iceberg.io.OutputFileFactory;
import org.apache.iceberg.mapping.NameMappingParser;
import org.apache.iceberg.parquet.Parquet;
import org.apache.iceberg.relocated.com.google.common.hash.Hasher;
import org.apache.iceberg.relocated.com.google.common.hash.Hashing;
import org.apache.iceberg.shaded.org.apache.parquet.schema.MessageType;
import org.apache.iceberg.types.Type;
import org.apache.iceberg.types.Types;
import org.apache.iceberg.util.PartitionUtil;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.catalyst.plans.logical.LocalRelation;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.StructType;

public class InDriver {
  private final ObjectMapper json = new ObjectMapper();
  // What this JVM's driver-side work read and wrote, since it started (the counterpart of Spark's
  // task metrics): files opened, rows read, bytes of files read, rows written, bytes written.
  private final AtomicLongArray io = new AtomicLongArray(5);

  /** The counters above, as JSON [files, rows read, bytes read, rows written, bytes written]. */
  public String io() throws Exception {
    List out = new ArrayList();
    for (int i = 0; i < io.length(); i++) {
      out.add(Long.valueOf(io.get(i)));
    }
    return json.writeValueAsString(out);
  }

  /** Key value -> the sorted ids of the requests naming it, from rows (key_value, request_ids),
   * in the rows' order (a LinkedHashMap: its keys double as the sorted value list). */
  public Map lookup(List rows) {
    Map out = new LinkedHashMap();
    for (int i = 0; i < rows.size(); i++) {
      Row row = (Row) rows.get(i);
      if (row.isNullAt(0)) {
        continue;
      }
      List ids = new ArrayList(row.getList(1));
      Collections.sort(ids);
      out.put(row.get(0), ids);
    }
    return out;
  }

  /** The keys of a lookup, in order, as a list. */
  public List values(Map lookup) {
    return new ArrayList(lookup.keySet());
  }

  /** The distinct rows of `ds` computed once (one Spark job, none for a local relation) and kept in
   * this JVM as a local relation: queries that only project and filter it are answered here without
   * a job. Duplicates are dropped here, not by Spark's distinct, which would add a shuffle to the job. */
  public Dataset kept(Dataset ds) {
    List distinct = new ArrayList(new java.util.LinkedHashSet(ds.collectAsList()));
    return ds.sparkSession().createDataFrame(distinct, ds.schema());
  }

  /** The rows of a kept `ds` (see `kept`) whose string column `column` holds one of `values`, as a
   * new local relation: filtered here, since Spark folds a filter on a local relation by compiling
   * its condition, and an IN of a thousand values compiled to a class of 400 KB of source. */
  public Dataset keptWhere(Dataset ds, String column, List values) {
    if (!isLocal(ds)) {
      throw new IllegalArgumentException("not a local relation: its rows would take a Spark job");
    }
    HashSet wanted = new HashSet(values);
    int index = ds.schema().fieldIndex(column);
    List rows = ds.collectAsList();  // a local relation: no job
    List chosen = new ArrayList();
    for (int i = 0; i < rows.size(); i++) {
      Row row = (Row) rows.get(i);
      if (!row.isNullAt(index) && wanted.contains(row.getString(index))) {
        chosen.add(row);
      }
    }
    return ds.sparkSession().createDataFrame(chosen, ds.schema());
  }

  /** The distinct values (NULL included) of string column `column` of `ds`, a local relation: read
   * here without a job, and only they cross Py4J, not every row. */
  public List distinctValues(Dataset ds, String column) {
    if (!isLocal(ds)) {
      throw new IllegalArgumentException("not a local relation: its rows would take a Spark job");
    }
    int index = ds.schema().fieldIndex(column);
    List rows = ds.collectAsList();  // a local relation: no job
    java.util.LinkedHashSet seen = new java.util.LinkedHashSet();
    for (int i = 0; i < rows.size(); i++) {
      Row row = (Row) rows.get(i);
      seen.add(row.isNullAt(index) ? null : row.getString(index));
    }
    return new ArrayList(seen);
  }

  /** The rows of `ds` (a local relation), each once per row of `pads` (dsr_key_id, dsr_ipad,
   * dsr_opad: a local relation of HMAC-SHA256 key pads), with that key's id and column `out`: the
   * HMAC of `column` cast to text (UTF-8), in hex, NULL where the column is NULL. What hmac.py's
   * Spark expression computes, here in the driver without a job. */
  public Dataset keyedHashes(Dataset ds, String column, Dataset pads, String out) throws Exception {
    if (!isLocal(ds) || !isLocal(pads)) {
      throw new IllegalArgumentException("not a local relation: its rows would take a Spark job");
    }
    int width = ds.schema().length();
    // the text as Spark's cast gives it: a projection of a local relation, folded here
    List rows = ds.withColumn("dsr_text", org.apache.spark.sql.functions.col(column).cast("string")).collectAsList();
    List keys = pads.collectAsList();
    List hashed = new ArrayList(rows.size() * keys.size());
    java.security.MessageDigest sha = java.security.MessageDigest.getInstance("SHA-256");
    for (int r = 0; r < rows.size(); r++) {
      Row row = (Row) rows.get(r);
      for (int k = 0; k < keys.size(); k++) {
        Row key = (Row) keys.get(k);
        Object[] values = new Object[width + 2];
        for (int c = 0; c < width; c++) {
          values[c] = row.get(c);
        }
        values[width] = key.get(0);
        if (!row.isNullAt(width)) {
          sha.update((byte[]) key.get(1));
          byte[] inner = sha.digest(row.getString(width).getBytes(StandardCharsets.UTF_8));
          sha.update((byte[]) key.get(2));
          values[width + 1] = hex(sha.digest(inner));
        }
        hashed.add(RowFactory.create(values));
      }
    }
    StructType schema = ds.schema().add("dsr_key_id", DataTypes.StringType).add(out, DataTypes.StringType);
    return ds.sparkSession().createDataFrame(hashed, schema);
  }

  /** The rows pickled by Python (a list of tuples) in the file at `path`, as a local relation of
   * `schema` (DDL, or a StructType's JSON): small driver-side data reaches Spark without a Python
   * worker and never as Py4J command text. Integer values fit the column's integer type. */
  public Dataset localPickled(SparkSession spark, String path, String schema) throws Exception {
    StructType struct = schema.startsWith("{") ? (StructType) DataType.fromJson(schema) : StructType.fromDDL(schema);
    List parsed;
    java.io.InputStream in = new java.io.BufferedInputStream(new java.io.FileInputStream(path));
    try {
      parsed = (List) new net.razorvine.pickle.Unpickler().load(in);
    } finally {
      in.close();
    }
    List rows = new ArrayList(parsed.size());
    for (int i = 0; i < parsed.size(); i++) {
      Object[] values = (Object[]) parsed.get(i);
      for (int c = 0; c < values.length; c++) {
        DataType type = struct.fields()[c].dataType();
        if (values[c] instanceof Number && type instanceof LongType) {
          values[c] = Long.valueOf(((Number) values[c]).longValue());
        } else if (values[c] instanceof Number && type instanceof IntegerType) {
          values[c] = Integer.valueOf(((Number) values[c]).intValue());
        }
      }
      rows.add(RowFactory.create(values));
    }
    return spark.createDataFrame(rows, struct);
  }

  /** Whether `ds` is a local relation once optimized: reading it takes no Spark job. */
  public boolean isLocal(Dataset ds) {
    return ds.queryExecution().optimizedPlan() instanceof LocalRelation;
  }

  /** A lookup (as `lookup` makes) grouped from the rows (request_id, key_value) of `ds`, or null
   * when `ds` is not a local relation once optimized (reading it would take a Spark job). Null
   * values are skipped. The values must be comparable (string, int, bigint). */
  public Map groupedLocal(Dataset ds) {
    if (!isLocal(ds)) {
      return null;
    }
    List rows = ds.collectAsList();  // a local relation: no job
    TreeMap grouped = new TreeMap();
    for (int i = 0; i < rows.size(); i++) {
      Row row = (Row) rows.get(i);
      if (row.isNullAt(1)) {
        continue;
      }
      TreeSet ids = (TreeSet) grouped.get(row.get(1));
      if (ids == null) {
        ids = new TreeSet();
        grouped.put(row.get(1), ids);
      }
      ids.add(row.getString(0));
    }
    Map out = new LinkedHashMap();
    for (Iterator it = grouped.entrySet().iterator(); it.hasNext();) {
      Map.Entry entry = (Map.Entry) it.next();
      out.put(entry.getKey(), new ArrayList((TreeSet) entry.getValue()));
    }
    return out;
  }

  /** A lookup as a local relation (key_value of the type `ds` has it, request_ids). */
  public Dataset requesters(Dataset ds, Map lookup) {
    List rows = new ArrayList();
    for (Iterator it = lookup.entrySet().iterator(); it.hasNext();) {
      Map.Entry entry = (Map.Entry) it.next();
      rows.add(RowFactory.create(new Object[] {entry.getKey(), entry.getValue()}));
    }
    StructType schema = new StructType()
        .add("key_value", ds.schema().apply("key_value").dataType(), false)
        .add("request_ids", DataTypes.createArrayType(DataTypes.StringType, false), false);
    return ds.sparkSession().createDataFrame(rows, schema);
  }

  public Keys keys() {
    return new Keys();
  }

  /** A table's key groups: each a top-level column, its lookup, and the columns a hit nulls. */
  public static class Keys {
    final List columns = new ArrayList();
    final List lookups = new ArrayList();
    final List redacted = new ArrayList();

    public Keys add(String column, Map lookup, List redact) {
      columns.add(column);
      lookups.add(lookup);
      redacted.add(new ArrayList(redact));
      return this;
    }
  }

  /** Why these tasks cannot be read here (null: they can): a file with deletes, a file format
   * other than Parquet, or a redacted column a partition is derived from. */
  public String refusal(Table table, List tasks, Keys keys) {
    for (int i = 0; i < tasks.size(); i++) {
      FileScanTask task = (FileScanTask) tasks.get(i);
      if (!task.deletes().isEmpty()) {
        return "a file has deletes";
      }
      if (task.file().format() != FileFormat.PARQUET) {
        return "a file is not Parquet";
      }
      PartitionSpec spec = (PartitionSpec) table.specs().get(Integer.valueOf(task.file().specId()));
      for (Iterator it = spec.fields().iterator(); it.hasNext(); ) {
        String source = table.schema().findColumnName(((PartitionField) it.next()).sourceId());
        for (int g = 0; g < keys.redacted.size(); g++) {
          for (Iterator r = ((List) keys.redacted.get(g)).iterator(); r.hasNext(); ) {
            if (((String) r.next()).equalsIgnoreCase(source)) {
              return "a partition is derived from a redacted column";
            }
          }
        }
      }
    }
    return null;
  }

  private static int position(Schema schema, String column) {
    List fields = schema.columns();
    for (int i = 0; i < fields.size(); i++) {
      if (((Types.NestedField) fields.get(i)).name().equalsIgnoreCase(column)) {
        return i;
      }
    }
    throw new IllegalArgumentException("no column " + column);
  }

  private CloseableIterable read(Table table, FileScanTask task, final Schema projection, Expression filter) {
    io.incrementAndGet(0);
    io.addAndGet(2, task.file().fileSizeInBytes());
    final Map constants = PartitionUtil.constantsMap(task, new BiFunction() {
      public Object apply(Object type, Object value) {
        return IdentityPartitionConverters.convertConstant((Type) type, value);
      }
    });
    Parquet.ReadBuilder builder = Parquet.read(table.io().newInputFile(task.file().location()))
        .project(projection)
        .createReaderFunc(new Function() {
          public Object apply(Object fileSchema) {
            return GenericParquetReaders.buildReader(projection, (MessageType) fileSchema, constants);
          }
        });
    String mapping = (String) table.properties().get("schema.name-mapping.default");
    if (mapping != null) {
      builder = builder.withNameMapping(NameMappingParser.fromJson(mapping));
    }
    if (filter != null) {  // skips row groups only: every row of the others is returned
      builder = builder.filter(filter);
    }
    return builder.build();
  }

  /** The sorted distinct ids of the requests naming `record` through any key group (null: none),
   * and in `hits` which groups named it. */
  private static TreeSet requests(Record record, int[] positions, Keys keys, boolean[] hits) {
    TreeSet ids = null;
    for (int g = 0; g < positions.length; g++) {
      Object value = record.get(positions[g]);
      List named = value == null ? null : (List) ((Map) keys.lookups.get(g)).get(value);
      hits[g] = named != null;
      if (named != null) {
        if (ids == null) {
          ids = new TreeSet();
        }
        ids.addAll(named);
      }
    }
    return ids;
  }

  /** The plan of the files of `tasks`: per file and combination of requests naming a row (none:
   * rows nobody asked about), the row count, as JSON [[file, [ids] or null, count], ...]. Reads the
   * key columns only, skipping row groups `filter` rules out. */
  public String plan(Table table, List tasks, Keys keys, Expression filter) throws Exception {
    Schema projection = table.schema().caseInsensitiveSelect(keys.columns);
    int[] positions = new int[keys.columns.size()];
    for (int g = 0; g < positions.length; g++) {
      positions[g] = position(projection, (String) keys.columns.get(g));
    }
    boolean[] hits = new boolean[positions.length];
    List out = new ArrayList();
    for (int i = 0; i < tasks.size(); i++) {
      FileScanTask task = (FileScanTask) tasks.get(i);
      Map counts = new LinkedHashMap();
      CloseableIterable rows = read(table, task, projection, filter);
      try {
        for (CloseableIterator it = rows.iterator(); it.hasNext(); ) {
          TreeSet ids = requests((Record) it.next(), positions, keys, hits);
          io.incrementAndGet(1);
          List group = ids == null ? null : new ArrayList(ids);
          Long n = (Long) counts.get(group);
          counts.put(group, Long.valueOf(n == null ? 1L : n.longValue() + 1L));
        }
      } finally {
        rows.close();
      }
      for (Iterator it = counts.keySet().iterator(); it.hasNext(); ) {
        Object group = it.next();
        List entry = new ArrayList();
        entry.add(task.file().location());
        entry.add(group);
        entry.add(counts.get(group));
        out.add(entry);
      }
    }
    return json.writeValueAsString(out);
  }

  /** Each key group's position in `schema` (into `positions`), and per group the positions of the
   * columns a hit sets to NULL. */
  private static List nulledPositions(Schema schema, Keys keys, int[] positions) {
    List nulled = new ArrayList();
    for (int g = 0; g < positions.length; g++) {
      positions[g] = position(schema, (String) keys.columns.get(g));
      List columns = (List) keys.redacted.get(g);
      int[] at = new int[columns.size()];
      for (int c = 0; c < at.length; c++) {
        at[c] = position(schema, (String) columns.get(c));
      }
      nulled.add(at);
    }
    return nulled;
  }

  /** A named row's columns as a redaction leaves them: each hit group's columns NULL. */
  private static void erase(Record record, boolean[] hits, List nulled) {
    for (int g = 0; g < hits.length; g++) {
      if (hits[g]) {
        int[] at = (int[]) nulled.get(g);
        for (int c = 0; c < at.length; c++) {
          record.set(at[c], null);
        }
      }
    }
  }

  /** The files of `tasks` rewritten as the erasure leaves their rows, one new file per old file
   * (none where no row is left), rows in the old file's order: a row a key group names is dropped
   * (`delete`) or has that group's columns set to NULL. Written like the table's own writers
   * (its properties: compression, metrics, bloom filters; its location provider), not committed:
   * the caller commits them or deletes them. Returns the new DataFiles. */
  public List rewrite(Table table, List tasks, Keys keys, boolean delete) throws Exception {
    Schema schema = table.schema();
    int[] positions = new int[keys.columns.size()];
    List nulled = nulledPositions(schema, keys, positions);
    boolean[] hits = new boolean[positions.length];
    String operation = "dsr-" + UUID.randomUUID();
    List written = new ArrayList();
    try {
      for (int i = 0; i < tasks.size(); i++) {
        FileScanTask task = (FileScanTask) tasks.get(i);
        DataFile file = (DataFile) task.file();
        PartitionSpec spec = (PartitionSpec) table.specs().get(Integer.valueOf(file.specId()));
        GenericAppenderFactory factory = new GenericAppenderFactory(table, schema, spec, table.properties(),
                                                                    null, null, null);
        OutputFileFactory names = OutputFileFactory.builderFor(table, i, 0L).format(FileFormat.PARQUET)
            .operationId(operation).build();
        DataWriter writer = null;
        CloseableIterable rows = read(table, task, schema, null);
        try {
          for (CloseableIterator it = rows.iterator(); it.hasNext(); ) {
            Record record = (Record) it.next();
            io.incrementAndGet(1);
            if (requests(record, positions, keys, hits) != null) {
              if (delete) {
                continue;
              }
              erase(record, hits, nulled);
            }
            if (writer == null) {
              writer = factory.newDataWriter(names.newOutputFile(spec, file.partition()), FileFormat.PARQUET,
                                             file.partition());
            }
            writer.write(record);
            io.incrementAndGet(3);
          }
        } finally {
          rows.close();
          if (writer != null) {
            writer.close();
            written.add(writer.toDataFile());
            io.addAndGet(4, writer.length());
          }
        }
      }
    } catch (Exception e) {
      deleteAll(table, written);  // nobody will commit them
      throw e;
    }
    return written;
  }

  private static void deleteAll(Table table, List files) {
    for (int i = 0; i < files.size(); i++) {
      table.io().deleteFile(((ContentFile) files.get(i)).location());
    }
  }

  /** Position delete files, one per data file: for the file at `locations[i]` (one of `tasks`'
   * files), the rows at positions `positions[i]` (little-endian 64-bit integers, ascending).
   * Written like the table's own delete writers (its delete file format, metrics and location
   * provider), each scoped to its one data file; not committed: the caller commits them (a row
   * delta) or deletes them. Reads nothing. Returns the DeleteFiles. */
  public List positionDeletes(Table table, List tasks, List locations, List positions) throws Exception {
    Map files = new HashMap();
    for (int i = 0; i < tasks.size(); i++) {
      DataFile file = (DataFile) ((FileScanTask) tasks.get(i)).file();
      files.put(file.location(), file);
    }
    Map properties = table.properties();
    FileFormat fileFormat = FileFormat.fromString((String) properties.getOrDefault(
        TableProperties.DELETE_DEFAULT_FILE_FORMAT, properties.getOrDefault(
            TableProperties.DEFAULT_FILE_FORMAT, TableProperties.DEFAULT_FILE_FORMAT_DEFAULT)));
    String operation = "dsr-" + UUID.randomUUID();
    List written = new ArrayList();
    try {
      for (int i = 0; i < locations.size(); i++) {
        String location = (String) locations.get(i);
        DataFile file = (DataFile) files.get(location);
        if (file == null) {
          throw new IllegalArgumentException("position deletes for a file that is not a candidate");
        }
        PartitionSpec spec = (PartitionSpec) table.specs().get(Integer.valueOf(file.specId()));
        GenericAppenderFactory factory = new GenericAppenderFactory(table, table.schema(), spec, properties,
                                                                    null, null, null);
        OutputFileFactory names = OutputFileFactory.builderFor(table, i, 0L).format(fileFormat)
            .operationId(operation).suffix("deletes").build();
        PositionDeleteWriter writer = factory.newPosDeleteWriter(names.newOutputFile(spec, file.partition()),
                                                                 fileFormat, file.partition());
        ByteBuffer at = ByteBuffer.wrap((byte[]) positions.get(i)).order(ByteOrder.LITTLE_ENDIAN);
        PositionDelete delete = PositionDelete.create();
        try {
          while (at.hasRemaining()) {
            writer.write(delete.set(location, at.getLong()));
            io.incrementAndGet(3);
          }
        } finally {
          writer.close();
        }
        written.add(writer.toDeleteFile());
        io.addAndGet(4, writer.length());
      }
    } catch (Exception e) {
      deleteAll(table, written);  // nobody will commit them
      throw e;
    }
    return written;
  }

  /** The collateral check's fingerprints of the files at `locations` (a JSON array) as snapshot
   * `snapshotId` holds them: [rows, wrapping sum of the first 64 bits of each row's hash, XOR of
   * the second 64] of the rows no key names, and of the named rows as the erasure must leave them
   * (nothing when `delete`, else each hit group's columns NULL). Every column of every row is
   * hashed (murmur3_128 over each value with its type and a null flag). Null when one of the files
   * has deletes or is not Parquet (the caller reads them with Spark), or is not in the snapshot. */
  public String fingerprint(Table table, long snapshotId, String locations, Keys keys, boolean delete)
      throws Exception {
    HashSet wanted = new HashSet((List) json.readValue(locations, List.class));
    List tasks = new ArrayList();
    CloseableIterable planned = table.newScan().useSnapshot(snapshotId).planFiles();
    try {
      for (CloseableIterator it = planned.iterator(); it.hasNext(); ) {
        FileScanTask task = (FileScanTask) it.next();
        if (wanted.remove(task.file().location())) {
          tasks.add(task);
        }
      }
    } finally {
      planned.close();
    }
    if (!wanted.isEmpty() || refusal(table, tasks, keys) != null) {
      return null;
    }
    Schema schema = table.schema();
    int[] positions = new int[keys.columns.size()];
    List nulled = nulledPositions(schema, keys, positions);
    boolean[] hits = new boolean[positions.length];
    long[] others = new long[3];
    long[] requested = new long[3];
    for (int i = 0; i < tasks.size(); i++) {
      CloseableIterable rows = read(table, (FileScanTask) tasks.get(i), schema, null);
      try {
        for (CloseableIterator it = rows.iterator(); it.hasNext(); ) {
          Record record = (Record) it.next();
          io.incrementAndGet(1);
          if (requests(record, positions, keys, hits) == null) {
            add(others, record);
          } else if (!delete) {
            erase(record, hits, nulled);
            add(requested, record);
          }
        }
      } finally {
        rows.close();
      }
    }
    List out = new ArrayList();
    out.add(asList(others));
    out.add(asList(requested));
    return json.writeValueAsString(out);
  }

  private static List asList(long[] values) {
    List out = new ArrayList();
    for (int i = 0; i < values.length; i++) {
      out.add(Long.valueOf(values[i]));
    }
    return out;
  }

  private static void add(long[] fingerprint, Record record) {
    Hasher hasher = Hashing.murmur3_128().newHasher();
    feed(hasher, record);
    ByteBuffer hash = ByteBuffer.wrap(hasher.hash().asBytes());
    fingerprint[0] += 1;
    fingerprint[1] += hash.getLong(0);
    fingerprint[2] ^= hash.getLong(8);
  }

  /** A value into the hash, tagged by kind, so that neither NULL nor a shifted value passes for another. */
  private static void feed(Hasher hasher, Object value) {
    if (value == null) {
      hasher.putByte((byte) 0);
    } else if (value instanceof StructLike) {
      StructLike struct = (StructLike) value;
      hasher.putByte((byte) 1);
      hasher.putInt(struct.size());
      for (int i = 0; i < struct.size(); i++) {
        feed(hasher, struct.get(i, Object.class));
      }
    } else if (value instanceof List) {
      List list = (List) value;
      hasher.putByte((byte) 2);
      hasher.putInt(list.size());
      for (int i = 0; i < list.size(); i++) {
        feed(hasher, list.get(i));
      }
    } else if (value instanceof Map) {
      Map map = (Map) value;
      hasher.putByte((byte) 3);
      hasher.putInt(map.size());
      long entries = 0L;  // order-free: a map's entries come in no fixed order
      for (Iterator it = map.entrySet().iterator(); it.hasNext(); ) {
        Map.Entry entry = (Map.Entry) it.next();
        Hasher one = Hashing.murmur3_128().newHasher();
        feed(one, entry.getKey());
        feed(one, entry.getValue());
        entries += one.hash().asLong();
      }
      hasher.putLong(entries);
    } else if (value instanceof ByteBuffer) {
      hasher.putByte((byte) 4);
      hasher.putBytes((ByteBuffer) ((ByteBuffer) value).duplicate());
    } else if (value instanceof byte[]) {
      hasher.putByte((byte) 4);
      hasher.putBytes((byte[]) value);
    } else {
      hasher.putByte((byte) 5);
      hasher.putString(value.getClass().getName(), StandardCharsets.UTF_8);
      hasher.putString(value.toString(), StandardCharsets.UTF_8);
    }
  }

  /** The ledger's hashes and the keys that made them, for liveFound: `storedJson` is [[request id,
   * identifier, hex hash, id of the key that made it or null], ...]; `keyRows` are Spark rows
   * (key id, hex key), so no key crosses Py4J as command text. */
  public HashLookup hashLookup(String storedJson, List keyRows) throws Exception {
    HashLookup lookup = new HashLookup();
    List rows = (List) json.readValue(storedJson, List.class);
    for (int i = 0; i < rows.size(); i++) {
      List row = (List) rows.get(i);
      List entries = (List) lookup.stored.get(row.get(2));
      if (entries == null) {
        entries = new ArrayList();
        lookup.stored.put(row.get(2), entries);
      }
      entries.add(row);
    }
    for (int i = 0; i < keyRows.size(); i++) {
      Row row = (Row) keyRows.get(i);
      lookup.keys.put(row.getString(0), hex(row.getString(1)));
    }
    return lookup;
  }

  public static class HashLookup {
    final Map stored = new HashMap();  // hex hash -> [[request id, identifier, hex hash, key id], ...]
    final Map keys = new LinkedHashMap();  // key id -> key bytes
  }

  /** The live check by keyed hash over the files of `tasks`: every key column's value (as text, as
   * Spark casts it) is hashed with HMAC-SHA256 under each key of `lookup` and looked up among its
   * stored hashes of the column's identifier (a hash whose key id is known is matched under that key
   * only). Answers {request id: rows}, a value found for one request under two keys counted once, as
   * verify.find_hashed counts. Reads the key columns only, skipping row groups `filter` rules out. */
  public String liveFound(Table table, List tasks, List columns, List identifiers, HashLookup lookup,
                          Expression filter) throws Exception {
    Map stored = lookup.stored;
    Map keys = lookup.keys;
    Schema projection = table.schema().caseInsensitiveSelect(columns);
    int[] positions = new int[columns.size()];
    List counts = new ArrayList();  // per key column: value text -> rows
    for (int g = 0; g < positions.length; g++) {
      positions[g] = position(projection, (String) columns.get(g));
      counts.add(new HashMap());
    }
    for (int i = 0; i < tasks.size(); i++) {
      CloseableIterable read = read(table, (FileScanTask) tasks.get(i), projection, filter);
      try {
        for (CloseableIterator it = read.iterator(); it.hasNext(); ) {
          Record record = (Record) it.next();
          io.incrementAndGet(1);
          for (int g = 0; g < positions.length; g++) {
            Object value = record.get(positions[g]);
            if (value != null) {
              Map perValue = (Map) counts.get(g);
              Long n = (Long) perValue.get(value.toString());
              perValue.put(value.toString(), Long.valueOf(n == null ? 1L : n.longValue() + 1L));
            }
          }
        }
      } finally {
        read.close();
      }
    }
    Map found = new HashMap();  // request id -> rows
    HashSet counted = new HashSet();  // (request id, key column, value) counted once
    for (Iterator k = keys.keySet().iterator(); k.hasNext(); ) {
      String keyId = (String) k.next();
      Mac mac = Mac.getInstance("HmacSHA256");
      mac.init(new SecretKeySpec((byte[]) keys.get(keyId), "HmacSHA256"));
      for (int g = 0; g < positions.length; g++) {
        Map perValue = (Map) counts.get(g);
        for (Iterator v = perValue.keySet().iterator(); v.hasNext(); ) {
          String value = (String) v.next();
          List entries = (List) stored.get(hex(mac.doFinal(value.getBytes(StandardCharsets.UTF_8))));
          for (int e = 0; entries != null && e < entries.size(); e++) {
            List entry = (List) entries.get(e);
            boolean sameKey = entry.get(3) == null || keyId.equals(entry.get(3));
            if (sameKey && identifiers.get(g).equals(entry.get(1))
                && counted.add(Arrays.asList(new Object[] {entry.get(0), Integer.valueOf(g), value}))) {
              Long n = (Long) found.get(entry.get(0));
              long add = ((Long) perValue.get(value)).longValue();
              found.put(entry.get(0), Long.valueOf(n == null ? add : n.longValue() + add));
            }
          }
        }
      }
    }
    return json.writeValueAsString(found);
  }

  private static byte[] hex(String text) {
    byte[] out = new byte[text.length() / 2];
    for (int i = 0; i < out.length; i++) {
      out[i] = (byte) Integer.parseInt(text.substring(2 * i, 2 * i + 2), 16);
    }
    return out;
  }

  private static String hex(byte[] bytes) {
    StringBuilder out = new StringBuilder();
    for (int i = 0; i < bytes.length; i++) {
      out.append(Character.forDigit((bytes[i] >> 4) & 15, 16)).append(Character.forDigit(bytes[i] & 15, 16));
    }
    return out.toString();
  }
}
