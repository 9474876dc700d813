// Small driver-side data held in the driver's JVM for lakehouse-dsr, compiled there by Janino
// (bridge.py): a batch's key values and their requests as lookups (lake/skipping.py's KeyValues),
// and local relations read, filtered and hashed here without a Spark job (lake/indriver.py's
// kept, kept_where, keyed_hashes, local_rows). No value crosses Py4J as command text. The engine
// needs these: they have no plain-Spark path (unlike InDriver's reads and writes of files).
// Janino compiles Java with generics erased: raw types and explicit casts throughout.
package lakehouse_dsr;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.plans.logical.LocalRelation;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.StructType;

public class LocalRows {
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
          values[width + 1] = org.apache.commons.codec.binary.Hex.encodeHexString(sha.digest(inner));
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
}
