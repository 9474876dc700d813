// Whether a row's key is one of a batch's values, and which requests name it, answered inside
// Spark's generated code for lakehouse-dsr (membership.py): a hash lookup where a broadcast join
// would build a key row, hash it and probe a hashed relation for every row. Spark's stock Invoke
// calls `test` through java.util.function.Predicate (`apply` through Function; a bigint or int key
// boxed), so generated code names no class of ours; the values travel as a broadcast variable
// (fetched once per executor, cached per deserialized copy), never as plan literals, and the
// literals' text is "membership" or "requesters", so no value reaches a plan string. Compiled by
// Janino (bridge.py): raw types throughout.
package lakehouse_dsr;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.Function;
import java.util.function.Predicate;
import org.apache.spark.SparkContext;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.objects.Invoke;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.ObjectType;
import org.apache.spark.unsafe.types.UTF8String;

public class Membership implements Predicate, java.io.Serializable {
  private final Broadcast values;
  private transient Set held;  // the broadcast's set: TorrentBroadcast.value() synchronizes every call

  public Membership() { this.values = null; }

  private Membership(Broadcast values) { this.values = values; }

  private Set held() {
    if (held == null) {
      held = (Set) values.value();
    }
    return held;
  }

  /** A UTF8String, Long or Integer key. */
  public boolean test(Object value) { return held().contains(value); }

  public String toString() { return "membership"; }

  /** A boolean column: whether `key` (of `type`: "string", "bigint" or "int") is one of `values`
   *  (Java strings, longs or integers), NULL where `key` is NULL. Deterministic: Spark may move it
   *  like any predicate. */
  public Column of(SparkContext sc, List values, Column key, String type) {
    HashSet set = new HashSet(values.size() * 2);
    for (int i = 0; i < values.size(); i++) {
      set.add(probe(values.get(i), type));
    }
    return invoke(new Membership(new JavaSparkContext(sc).broadcast(set)), Predicate.class, "test", key,
        DataTypes.BooleanType);
  }

  /** An array<string> column: the ids of the requests naming `key` (of `type`) as `lookup` lists them
   *  (a value -> sorted request ids map: InDriver.lookup's), NULL where none does or `key` is NULL.
   *  What a broadcast join with the lookup's rows would add, without building and probing a key row. */
  public Column requesters(SparkContext sc, Map lookup, Column key, String type) {
    HashMap byValue = new HashMap(lookup.size() * 2);
    for (Iterator it = lookup.entrySet().iterator(); it.hasNext();) {
      Map.Entry entry = (Map.Entry) it.next();
      List ids = (List) entry.getValue();
      Object[] items = new Object[ids.size()];
      for (int i = 0; i < items.length; i++) {
        items[i] = UTF8String.fromString((String) ids.get(i));
      }
      byValue.put(probe(entry.getKey(), type), new GenericArrayData(items));
    }
    return invoke(new Requesters(new JavaSparkContext(sc).broadcast(byValue)), Function.class, "apply", key,
        DataTypes.createArrayType(DataTypes.StringType, false));
  }

  /** A value as generated code hands it to `test` or `apply`: a UTF8String, or a boxed bigint or int. */
  private static Object probe(Object value, String type) {
    if (type.equals("string")) {
      return UTF8String.fromString((String) value);
    } else if (type.equals("bigint")) {
      return Long.valueOf(((Number) value).longValue());
    } else if (type.equals("int")) {
      return Integer.valueOf(((Number) value).intValue());
    }
    throw new IllegalArgumentException("no membership test for keys of type " + type);
  }

  /** `target.method(key)` inside generated code; NULL where `key` is NULL. Deterministic: Spark may
   *  move it like any predicate. */
  private static Column invoke(Object target, Class as, String method, Column key,
      org.apache.spark.sql.types.DataType type) {
    List arguments = new ArrayList();
    arguments.add(key.expr());
    return new Column(new Invoke(new Literal(target, new ObjectType(as)), method, type, seq(arguments),
        seq(new ArrayList()), true, true, true));
  }

  private static scala.collection.Seq seq(List items) {
    return scala.collection.JavaConverters.asScalaBuffer(items).toSeq();
  }

  /** The request ids by value, looked up inside generated code (see `requesters`). */
  static class Requesters implements Function, java.io.Serializable {
    private final Broadcast byValue;
    private transient Map held;

    Requesters(Broadcast byValue) { this.byValue = byValue; }

    public Object apply(Object value) {
      if (held == null) {
        held = (Map) byValue.value();
      }
      return held.get(value);
    }

    public String toString() { return "requesters"; }
  }
}
